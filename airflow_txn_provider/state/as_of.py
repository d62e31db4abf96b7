"""A state read as it stood after any kept txid, a key's history, and what one txid changed.

The undo records (:mod:`~airflow_txn_provider.state.undo`: one row per committed txid per state,
the batch's keys and each key's row before that commit) hold the past. The state as it stood
after txid N is, for each key, its current row, unless a commit after N touched it: then the row
before the *first* commit after N that touched it (a key that did not exist then was absent
after N). So N can be read exactly while every commit after it kept its undo record: from
``rewind_floor - 1`` (:func:`as_of_floor`, the state a rewind to ``floor`` would restore) to the
last committed txid; anything else is :class:`~airflow_txn_provider.rules.exceptions.
StateTxidNotReadableError`, naming how far back it can go. A state whose rows keep the txid
that last touched them (transactional, opaque; a record keeps it as ``old_txid``) finds that row
without sorting: the current rows of txid <= N, and in each record after N the keys whose row
before was of a txid <= N; its key's history walks back through those txids (``make
bench-asof``: docs/benchmarks.md).

Every read is ONE statement (its bounds, from ``txn_pipeline``, in the same snapshot as the
rows), so it is consistent while commits go on. Nothing here runs in the commit: the apply
statement writes the undo records already.

* :meth:`AsOfReads.as_of` (on every :class:`~airflow_txn_provider.state.maps.MapState`), and
  ``txn_as_of_<state>(txid bigint)``, a set-returning SQL function made with the state's tables
  (:func:`create_as_of_function`) for a BI tool: ``SELECT * FROM txn_as_of_words(812)``;
* :meth:`AsOfReads.history`: each kept txid that touched a key, newest first, with before/after;
* :meth:`AsOfReads.changes` and :func:`txid_changes`: the keys a txid touched, largest change
  first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from airflow_txn_provider.rules.exceptions import StateTxidNotReadableError, UnknownPipelineError
from airflow_txn_provider.rules.history import rewind_floor
from airflow_txn_provider.rules.names import as_of_function, quote_ident
from airflow_txn_provider.state.backing import BackingTable
from airflow_txn_provider.state.kinds import rule_for
from airflow_txn_provider.state.registry import of_pipeline, registered

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

DEFAULT_LIMIT = 100
"""How many entries a history or a txid's changes returns unless told."""

EXISTED = '"txn:existed"'
BEFORE = '"txn:before"'
"""The undo record's ``existed`` and ``old_value``, unnested (no key column can be named so)."""
WAS = '"txn:was"'
"""The undo record's ``old_txid`` (the txid that touched the key before), unnested."""
BOUNDS = (
    'SELECT p.last_committed_txid AS "txn:last", p.pruned_through_txid AS "txn:pruned", '
    'p.undo_from_txid AS "txn:undo_from" FROM txn_pipeline p WHERE p.name = :pipeline'
)
"""The pipeline's bounds, read in the statement that reads the rows (one snapshot)."""


def floor_sql(pruned_through: str, undo_from: str) -> str:
    """:func:`as_of_floor` in SQL, of the two columns' expressions (the SQL function and a key's
    history read it in their own snapshot)."""
    first = f"CASE WHEN {pruned_through} > 0 THEN {pruned_through} + 2 ELSE 1 END"
    return f"(GREATEST({undo_from}, {first}) - 1)"


def as_of_floor(pruned_through: int, undo_from: int) -> int:
    """The oldest txid a state can be read as of: the state a rewind to the oldest txid it can
    go back to (:func:`~airflow_txn_provider.rules.history.rewind_floor`) would restore, after the
    txid before it (0: the empty state before txid 1)."""
    return rewind_floor(pruned_through, undo_from) - 1


def check_readable(
    pipeline: str, state: str, txid: int, bounds: Any, *, what: str, after: int = 0
) -> None:
    """Refuse (:class:`StateTxidNotReadableError`) reading ``state`` as of ``txid`` outside
    ``[as_of_floor + after, last committed]`` of ``bounds`` (``(last, pruned_through,
    undo_from)``; ``None``: no such pipeline). ``after`` 1: what ``txid`` changed (the state as
    of ``txid - 1`` too). ``what`` says what was asked, for the message."""
    if bounds is None:
        raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
    last, pruned, undo_from = (int(b) for b in bounds)
    floor = as_of_floor(pruned, undo_from) + after
    if floor <= txid <= last:
        return
    why = (
        f"the last committed txid is {last}"
        if txid > last
        else "retention keeps undo records for its keep_txids newest committed txids (a "
        "version without undo records committed the ones before)"
    )
    raise StateTxidNotReadableError(
        f"state {state!r}: cannot read {what}: txids {floor} to {last} can be read ({why})",
        pipeline=pipeline,
        txid=txid,
        state=state,
        floor=str(floor),
        last_committed=str(last),
    )


# -- the SQL ---------------------------------------------------------------------------------


def _unnest(t: BackingTable, alias: str = "k") -> str:
    """``FROM`` the undo records ``u``, each unnested into its keys and their rows before."""
    arrays = ", ".join([*(f"u.{k}" for k in t.quoted_keys), "u.existed", "u.old_value"])
    names = ", ".join([*t.quoted_keys, EXISTED, BEFORE])
    return f"{t.qundo} u CROSS JOIN LATERAL unnest({arrays}) AS {alias}({names})"


def _match(t: BackingTable, a: str, b: str) -> str:
    return " AND ".join(f"{a}.{k} = {b}.{k}" for k in t.quoted_keys)


def _key_filter(t: BackingTable, alias: str) -> str:
    """``AND`` the row's keys are among those bound as ``:key0…`` (one array per key column)."""
    cols = ", ".join(f"{alias}.{k}" for k in t.quoted_keys)
    arrays = ", ".join(f"CAST(:key{i} AS {typ}[])" for i, typ in enumerate(t.key_types()))
    return f" AND ({cols}) IN (SELECT * FROM unnest({arrays}))"


def _as_of_by_txid(t: BackingTable, txid: str, keys: bool) -> str:
    """:func:`as_of_select` of a state whose rows keep the txid that last touched them (the
    transactional and opaque kinds; an undo record keeps it as ``old_txid``): a key no commit
    after ``txid`` touched has its row's txid ``<= txid``; of the records after ``txid`` that
    touched a key, the first is the one whose row before was last touched ``<= txid`` (or that
    made the key). No sort, no join: two scans."""
    current, past = (_key_filter(t, "s"), _key_filter(t, "k")) if keys else ("", "")
    arrays = ", ".join([*(f"u.{k}" for k in t.quoted_keys), "u.existed", "u.old_value"])
    names = ", ".join([*t.quoted_keys, EXISTED, BEFORE, WAS])
    return f"""
        SELECT {", ".join(f"s.{k}" for k in t.quoted_keys)}, s.value FROM {t.qtable} s
        WHERE s.txid <= {txid}{current}
        UNION ALL
        SELECT {", ".join(f"k.{k}" for k in t.quoted_keys)}, k.{BEFORE}
        FROM {t.qundo} u CROSS JOIN LATERAL unnest({arrays}, u.old_txid) AS k({names})
        WHERE u.txid > {txid} AND k.{EXISTED} AND k.{WAS} <= {txid}{past}"""


def as_of_select(t: BackingTable, txid: str, *, keys: bool = False) -> str:
    """The state's rows ``(keys…, value)`` as they stood after the txid ``txid`` (SQL), whole or
    (``keys``) those bound as ``:key0…``: the current rows no later commit touched, and the rows
    before the first later commit that touched a key, where it existed."""
    if "txid" in t.row_columns:
        return _as_of_by_txid(t, txid, keys)
    cols = ", ".join(f"k.{k}" for k in t.quoted_keys)
    filtered = _key_filter(t, "k") if keys else ""
    return f"""
        WITH "txn:changed" AS (
            SELECT DISTINCT ON ({cols}) {cols}, k.{EXISTED}, k.{BEFORE}
            FROM {_unnest(t)}
            WHERE u.txid > {txid}{filtered}
            ORDER BY {cols}, u.txid
        )
        SELECT {", ".join(f"s.{k}" for k in t.quoted_keys)}, s.value FROM {t.qtable} s
        WHERE NOT EXISTS (SELECT 1 FROM "txn:changed" c WHERE {_match(t, "c", "s")})
            {_key_filter(t, "s") if keys else ""}
        UNION ALL
        SELECT {", ".join(f"c.{k}" for k in t.quoted_keys)}, c.{BEFORE} FROM "txn:changed" c
        WHERE c.{EXISTED}"""


def _function_body(t: BackingTable, pipeline: str) -> str:
    """The SQL function's body: the bounds of :func:`check_readable` (the same rule, in SQL),
    then the rows. ``STABLE``: its two queries see the snapshot of the query that calls it."""
    literal = "'" + pipeline.replace("'", "''") + "'"
    lowest = floor_sql("b.pruned", "b.undo_from")
    return f"""
#variable_conflict use_column
DECLARE
    b record;
    lowest bigint;
BEGIN
    SELECT p.last_committed_txid AS last, p.pruned_through_txid AS pruned,
           p.undo_from_txid AS undo_from
    INTO b FROM txn_pipeline p WHERE p.name = {literal};
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pipeline % is not registered', {literal} USING ERRCODE = '42704';
    END IF;
    lowest := {lowest};
    IF $1 IS NULL OR $1 < lowest OR $1 > b.last THEN
        RAISE EXCEPTION 'state {t.name}: cannot read as of txid %: txids % to % can be read', $1,
            lowest, b.last USING ERRCODE = '22023',
            HINT = 'retention keeps undo records for the newest keep_txids committed txids';
    END IF;
    RETURN QUERY {as_of_select(t, "$1")};
END"""


def create_as_of_function(conn: Connection, t: BackingTable, pipeline: str) -> None:
    """``txn_as_of_<state>(txid bigint)``, returning the state's key columns and ``value`` as
    they stood after ``txid`` (a txid out of reach raises SQLSTATE 22023, naming the reach).
    Idempotent, and cheap when it is there already (the state's DDL runs at every begin): made
    or replaced only when missing or unlike this version's. In the caller's transaction (under
    the DDL lock of :func:`~airflow_txn_provider.state.backing.lock_ddl`)."""
    name = quote_ident(as_of_function(t.name))
    body = _function_body(t, pipeline)
    found = conn.execute(
        text("SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure(:f)"),
        {"f": f"{name}(bigint)"},
    ).scalar_one_or_none()
    if found == body:
        return
    typed = zip(t.quoted_keys, t.key_types(), strict=True)
    columns = ", ".join([*(f"{k} {typ}" for k, typ in typed), f"value {t.value_type}"])
    # no parameters: the body's RAISE holds % placeholders of its own
    conn.execution_options(no_parameters=True).exec_driver_sql(
        f"CREATE OR REPLACE FUNCTION {name}(txid bigint) RETURNS TABLE ({columns}) "
        f"LANGUAGE plpgsql STABLE AS $txn_as_of${body}$txn_as_of$"
    )


def _key_params(t: BackingTable, keys: Sequence[Sequence[Any]]) -> dict[str, list[Any]]:
    columns = len(t.quoted_keys)
    for key in keys:
        if len(key) != columns:
            raise ValueError(f"state {t.name!r}: a key has {columns} column(s), got {key!r}")
    return {f"key{i}": [key[i] for key in keys] for i in range(columns)}


def _with_bounds(inner: str, order: str = "") -> str:
    """``inner``'s rows, each after the pipeline's bounds; one row of bounds alone when it has
    none (its first key column is then null: a stored key never is)."""
    return f"""
        WITH "txn:bounds" AS ({BOUNDS}), "txn:rows" AS ({inner})
        SELECT * FROM "txn:bounds" b LEFT JOIN "txn:rows" r ON true
        {f"ORDER BY {order}" if order else ""}"""


def read_as_of(
    conn: Connection,
    t: BackingTable,
    pipeline: str,
    txid: int,
    keys: Sequence[Sequence[Any]] | None = None,
) -> dict[tuple[Any, ...], Any]:
    """``{(key values…): value}`` of the state as it stood after ``txid``, whole or the ``keys``
    given (a key absent then is absent here): one statement."""
    params: dict[str, Any] = {"pipeline": pipeline, "n": int(txid)}
    # a global state's one key: no filter, unless none is asked (as MapState.get)
    filtered = keys is not None and (bool(t.keys) or not keys)
    if keys is not None and filtered:
        params.update(_key_params(t, keys))
    # the bounds in a row of their own (its key null: a stored key never is), not on each row
    width = len(t.quoted_keys)
    nulls = ", ".join(["NULL"] * (width + 1))
    rows = as_of_select(t, "CAST(:n AS bigint)", keys=filtered)
    sql = f"""
        SELECT b.*, {nulls} FROM ({BOUNDS}) b
        UNION ALL SELECT NULL, NULL, NULL, r.* FROM ({rows}) r"""
    found: dict[tuple[Any, ...], Any] = {}
    bounds = None
    for r in conn.execute(text(sql), params):
        if r[3] is None:
            bounds = r[:3]
        else:
            found[tuple(r[3 : 3 + width])] = r[3 + width]
    check_readable(pipeline, t.name, txid, bounds, what=f"as of {txid}")
    return found


@dataclass(frozen=True)
class KeyChange:
    """A txid that touched a key: the key's value before and after its commit (``None``: the
    key was absent), the attempt that committed it and when."""

    txid: int
    attempt: int | None
    committed_at: datetime | None
    before: Any
    after: Any


def _walk(t: BackingTable, at: list[str], current: str) -> str:
    """A key's hits, walked from its row's txid back through each record's ``old_txid`` (the
    transactional and opaque kinds): only the records that touched the key are read."""
    first, types = t.quoted_keys[0], t.key_types()
    pos = f"array_position(u.{first}, CAST(:k0 AS {types[0]}))"
    if at:  # the first column's value may be in the record more than once
        pos = f"""(SELECT p.i FROM unnest(array_positions(u.{first}, CAST(:k0 AS {types[0]})))
                   AS p(i) WHERE {" AND ".join(at)} LIMIT 1)"""
    step = "u.txid, u.existed[r.i], u.old_value[r.i], u.old_txid[r.i]"
    return f"""RECURSIVE walk (txid, existed, before, was, n) AS (
            SELECT {step}, 1 FROM {t.qtable} s JOIN {t.qundo} u ON u.txid = s.txid
            CROSS JOIN LATERAL (SELECT {pos} AS i OFFSET 0) r WHERE {current}
            UNION ALL
            SELECT {step}, w.n + 1 FROM walk w JOIN {t.qundo} u ON u.txid = w.was
            CROSS JOIN LATERAL (SELECT {pos} AS i OFFSET 0) r WHERE w.existed AND w.n <= :limit
        ), hits AS (
            SELECT w.txid, CASE WHEN w.existed THEN w.before END AS before FROM walk w
        )"""


def key_history(
    conn: Connection, t: BackingTable, pipeline: str, key: Sequence[Any], limit: int
) -> list[KeyChange]:
    """Each txid whose commit touched ``key``, newest first, at most ``limit``: those after the
    txid the state can be read as of first (:func:`as_of_floor`; what each changed can be read
    too), in one statement. A state whose rows keep their txid walks back from the key's row
    through each record's ``old_txid`` (:func:`_walk`); another finds the key in every record.
    A key's place in a record is found on the first key column (no unnesting), the other
    columns and the row before read there."""
    types = t.key_types()
    if len(key) != len(types):
        raise ValueError(f"state {t.name!r}: a key has {len(types)} column(s), got {key!r}")
    first, *others = t.quoted_keys
    at = [f"u.{k}[p.i] = CAST(:k{j} AS {types[j]})" for j, k in enumerate(others, start=1)]
    current = " AND ".join(
        f"s.{k} = CAST(:k{j} AS {types[j]})" for j, k in enumerate(t.quoted_keys)
    )
    hits = (
        _walk(t, at, current)
        if "txid" in t.row_columns
        else f"""hits AS (
            SELECT u.txid, CASE WHEN u.existed[p.i] THEN u.old_value[p.i] END AS before
            FROM {t.qundo} u
            CROSS JOIN LATERAL unnest(array_positions(u.{first}, CAST(:k0 AS {types[0]}))) AS p(i)
            {"WHERE " + " AND ".join(at) if at else ""}
        )"""
    )
    sql = f"""
        WITH {hits}, ordered AS (
            SELECT h.txid, h.before,
                   CASE WHEN row_number() OVER w = 1
                        THEN (SELECT s.value FROM {t.qtable} s WHERE {current})
                        ELSE lag(h.before) OVER w END AS after
            FROM hits h WINDOW w AS (ORDER BY h.txid DESC)
        )
        SELECT o.txid, t.attempt, t.committed_at, o.before, o.after
        FROM ordered o JOIN txn_pipeline p ON p.name = :pipeline
        LEFT JOIN txn_transaction t ON t.pipeline = p.name AND t.txid = o.txid
        WHERE o.txid > {floor_sql("p.pruned_through_txid", "p.undo_from_txid")}
        ORDER BY o.txid DESC LIMIT :limit"""
    params = {f"k{j}": v for j, v in enumerate(key)}
    rows = conn.execute(text(sql), {**params, "pipeline": pipeline, "limit": int(limit)})
    return [KeyChange(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows]


@dataclass(frozen=True)
class TxidChange:
    """A key a txid touched: its value before and after the commit (``None``: absent)."""

    key: tuple[Any, ...]
    before: Any
    after: Any


def changes_of(
    conn: Connection, t: BackingTable, pipeline: str, txid: int, limit: int
) -> list[TxidChange]:
    """The keys ``txid``'s commit touched, with their values before and after it, the largest
    absolute change first (then by key), at most ``limit``: one statement. The after is the row
    before the next commit that touched the key, or the current one."""
    cols = ", ".join(f"k.{k}" for k in t.quoted_keys)
    t_cols = ", ".join(f"t.{k}" for k in t.quoted_keys)
    change = 'abs(coalesce(r."txn:after"::numeric, 0) - coalesce(r."txn:was"::numeric, 0))'
    inner = f"""
        WITH touched AS (
            SELECT {cols}, k.{EXISTED}, k.{BEFORE} FROM {_unnest(t)} WHERE u.txid = :n
        ), later AS (
            SELECT DISTINCT ON ({cols}) {cols}, k.{EXISTED}, k.{BEFORE} FROM {_unnest(t)}
            WHERE u.txid > :n AND ({cols}) IN (SELECT {t_cols} FROM touched t)
            ORDER BY {cols}, u.txid
        )
        SELECT {t_cols},
               CASE WHEN t.{EXISTED} THEN t.{BEFORE} END AS "txn:was",
               CASE WHEN l.{t.quoted_keys[0]} IS NOT NULL
                    THEN CASE WHEN l.{EXISTED} THEN l.{BEFORE} END
                    ELSE s.value END AS "txn:after"
        FROM touched t LEFT JOIN later l ON {_match(t, "l", "t")}
        LEFT JOIN {t.qtable} s ON {_match(t, "s", "t")}"""
    keys = ", ".join(f"r.{k}" for k in t.quoted_keys)
    sql = _with_bounds(inner, f"{change} DESC, {keys}") + " LIMIT :limit"
    rows = conn.execute(text(sql), {"pipeline": pipeline, "n": int(txid), "limit": int(limit)})
    rows_read = rows.all()
    bounds = rows_read[0][:3] if rows_read else None
    check_readable(pipeline, t.name, txid, bounds, what=f"what txid {txid} changed", after=1)
    width = len(t.quoted_keys)
    return [
        TxidChange(tuple(r[3 : 3 + width]), r[3 + width], r[4 + width])
        for r in rows_read
        if r[3] is not None
    ]


def txid_changes(
    bind: Engine | Connection, pipeline: str, txid: int, *, limit: int = DEFAULT_LIMIT
) -> dict[str, list[TxidChange]]:
    """What ``txid`` changed in each Postgres state of ``pipeline``, by state name: its touched
    keys with their values before and after, the largest absolute change first, at most
    ``limit`` per state. One REPEATABLE READ snapshot when given an engine (every state as of
    the same commits); on a connection, in the caller's transaction. Refuses a txid it cannot
    read exactly (:class:`StateTxidNotReadableError`)."""
    from sqlalchemy.engine import Engine

    if isinstance(bind, Engine):
        with bind.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            with conn.begin():
                return txid_changes(conn, pipeline, txid, limit=limit)
    tables = [
        BackingTable(name, d["keys"], d["value_type"], d["combiner"], rule_for(d["kind"]))
        for _, name, d in registered(bind, of_pipeline(pipeline))
    ]
    return {t.name: changes_of(bind, t, pipeline, txid, limit) for t in tables}


class AsOfReads:
    """The reads of the past a :class:`~airflow_txn_provider.state.maps.MapState` has (this
    module's, on the state's tables)."""

    pipeline: str
    name: str

    @property
    def backing(self) -> BackingTable:  # the state's own
        raise NotImplementedError

    def as_of(
        self, conn: Connection, txid: int, keys: Sequence[Sequence[Any]] | None = None
    ) -> dict[tuple[Any, ...], Any]:
        """The state as it stood right after ``txid`` committed, ``{(key values…): value}`` as
        :meth:`~airflow_txn_provider.state.maps.MapState.items` has it (``keys``: only those,
        as :meth:`~airflow_txn_provider.state.maps.MapState.get`), in one statement: one
        snapshot while commits go on. ``txid`` 0 is the empty state before txid 1. Refuses
        (:class:`~airflow_txn_provider.rules.exceptions.StateTxidNotReadableError`, naming how
        far back it can go) a txid older than the undo records retention keeps, or not
        committed."""
        return read_as_of(conn, self.backing, self.pipeline, txid, keys)

    def history(
        self, conn: Connection, key: Sequence[Any] = (True,), *, limit: int = DEFAULT_LIMIT
    ) -> list[KeyChange]:
        """Each committed txid that touched ``key`` (its key values, as a tuple; a global
        state's is ``(True,)``), newest first, at most ``limit``: the attempt that committed
        it, when, and the value before and after (``None``: absent). Covers the txids
        retention keeps."""
        return key_history(conn, self.backing, self.pipeline, tuple(key), limit)

    def changes(
        self, conn: Connection, txid: int, *, limit: int = DEFAULT_LIMIT
    ) -> list[TxidChange]:
        """The keys ``txid``'s commit touched, with their values before and after, the largest
        absolute change first, at most ``limit``. Refused as :meth:`as_of` of ``txid - 1`` and
        ``txid`` would be."""
        return changes_of(conn, self.backing, self.pipeline, txid, limit)


class GlobalAsOfReads(AsOfReads):
    """A global state's value as of a txid."""

    def value_as_of(self, conn: Connection, txid: int) -> Any:
        """The value as it stood right after ``txid`` committed (``None``: none yet); refused
        as :meth:`~AsOfReads.as_of` is."""
        return self.as_of(conn, txid).get((True,))


__all__ = [
    "DEFAULT_LIMIT",
    "AsOfReads",
    "GlobalAsOfReads",
    "KeyChange",
    "TxidChange",
    "as_of_floor",
    "as_of_function",
    "as_of_select",
    "changes_of",
    "check_readable",
    "create_as_of_function",
    "floor_sql",
    "key_history",
    "read_as_of",
    "txid_changes",
]
