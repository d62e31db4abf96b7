"""Map states in Postgres (:class:`MapState`, :class:`GlobalState`, :class:`BucketCountState`):
their tables and registry, staging a batch, applying it, reading them. The package's docstring
(:mod:`airflow_txn_provider.state`) tells the two steps; each kind's rule is in
:mod:`~airflow_txn_provider.state.kinds`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import delete, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DataError

from airflow_txn_provider.exceptions import (
    MalformedOutputError,
    StagedOutputMismatchError,
    StateAheadOfLogError,
    StateDefinitionError,
    StateValueOutOfRangeError,
    TxnError,
)
from airflow_txn_provider.models import MAP_SUMMARY, STATE_REGISTRY
from airflow_txn_provider.names import SQL_NAME, check_name, quote_ident
from airflow_txn_provider.retries import sqlstate
from airflow_txn_provider.state.kinds import KindRule, rule_for
from airflow_txn_provider.state.staging import (
    STAGE_JOB_COLUMN,
    Refused,
    arrow_rows,
    check_rows,
    copy_rows,
)
from airflow_txn_provider.vocabulary import StateKind

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy import ColumnElement
    from sqlalchemy.engine import Connection, Engine

_log = logging.getLogger(__name__)


KEY_TYPES = frozenset(
    {
        "text",
        "bigint",
        "integer",
        "smallint",
        "boolean",
        "date",
        "timestamptz",
        "numeric",
        "double precision",
    }
)
VALUE_TYPES = frozenset({"bigint", "integer", "numeric", "double precision"})
_COMBINERS = {
    # name: (binary SQL with {a} {b}, aggregate over staged deltas)
    "sum": ("{a} + {b}", "sum"),
    "max": ("GREATEST({a}, {b})", "max"),
    "min": ("LEAST({a}, {b})", "min"),
}
_RESERVED = frozenset(
    {"value", "prev_value", "txid", "attempt", "delta", "singleton", STAGE_JOB_COLUMN}
)
NUMERIC_OUT_OF_RANGE = "22003"
_FLOAT_TYPES = frozenset({"numeric", "double precision"})
"""Value types that can hold NaN and infinities."""
# Serialises DDL of state tables across processes.
_DDL_LOCK_KEY = 0x7478_6E5F_7374_61  # "txn_sta"


def _ident(value: str, what: str) -> str:
    return check_name(value, SQL_NAME, what=what)


def _log_tables() -> frozenset[str]:
    """The transaction log's own tables, which no state table may take the name of."""
    from airflow_txn_provider.models import Base
    from airflow_txn_provider.schema import VERSION_TABLE

    return frozenset([*Base.metadata.tables, VERSION_TABLE])


def _check_table_names(name: str) -> None:
    for table in (f"txn_state_{name}", f"txn_stage_{name}"):
        if table in _log_tables():
            raise ValueError(
                f"state name {name!r} is refused: its table {table} is one of the transaction "
                "log's own tables; choose another name"
            )


@dataclass(frozen=True)
class ApplyResult:
    staged_rows: int
    keys: int


@dataclass(frozen=True, eq=False)  # identity equality: a state is a handle, usable as a dict key
class MapState:
    """A Postgres map state of one pipeline.

    :param pipeline: the pipeline whose txids update this state (one state belongs to one pipeline).
    :param name: state name; the tables are ``txn_state_<name>`` and ``txn_stage_<name>``.
    :param kind: ``non_transactional``, ``transactional`` or ``opaque``.
    :param keys: key columns as ``{column: SQL type}`` (e.g. ``{"word": "text"}``).
    :param value_type: SQL type of the value: bigint (default), integer, numeric, double precision.
    :param combiner: how deltas combine: ``sum`` (default), ``max`` or ``min``.
    :param fillfactor: storage fill factor of the state table (10-100, default 50). Space left free
        on each page lets Postgres update a key in place (a HOT update, no new index entry): with
        every key of a batch updated, 50 took bench-core's 1e5-key apply from 0.72 s to ~0.45 s,
        at up to twice the table size. A storage setting only: not part of the stored definition.
    """

    pipeline: str
    name: str
    kind: StateKind | str = StateKind.TRANSACTIONAL
    keys: Mapping[str, str] = field(default_factory=dict)
    value_type: str = "bigint"
    combiner: str = "sum"
    fillfactor: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StateKind(self.kind))
        _ident(self.name, "state name")
        _check_table_names(self.name)
        for column, sqltype in self.keys.items():
            _ident(column, "key column")
            if column in _RESERVED:
                raise ValueError(
                    f"key column {column!r} is reserved; reserved: {sorted(_RESERVED)}"
                )
            if sqltype not in KEY_TYPES:
                raise ValueError(
                    f"key column {column!r} has type {sqltype!r}; allowed: {sorted(KEY_TYPES)}"
                )
        if self.value_type not in VALUE_TYPES:
            raise ValueError(f"value_type {self.value_type!r}; allowed: {sorted(VALUE_TYPES)}")
        if self.combiner not in _COMBINERS:
            raise ValueError(f"combiner {self.combiner!r}; allowed: {sorted(_COMBINERS)}")
        if not 10 <= int(self.fillfactor) <= 100:
            raise ValueError(f"fillfactor {self.fillfactor!r} must be within 10..100")
        object.__setattr__(self, "keys", dict(self.keys))

    @classmethod
    def load(cls, bind: Engine | Connection, name: str) -> MapState:
        """The state registered as ``name`` (by :meth:`create`), e.g. inside a Spark job."""
        states = _load(bind, STATE_REGISTRY.c.name == name)
        if not states:
            raise StateDefinitionError(f"state {name!r} is not registered (create it first)")
        return states[0]

    # -- names -----------------------------------------------------------------------------------

    @property
    def rule(self) -> KindRule:
        """How this state's kind applies a batch (:mod:`~airflow_txn_provider.state.kinds`)."""
        return rule_for(self.kind)

    @property
    def table(self) -> str:
        return f"txn_state_{self.name}"

    @property
    def stage_table(self) -> str:
        return f"txn_stage_{self.name}"

    @property
    def output_key(self) -> str:
        """Key of this state's staged row count in a txid's recorded output."""
        return f"staged:{self.name}"

    @property
    def derived_from(self) -> str | None:
        """Name of the state this one is computed from at commit time (``None``: staged by jobs)."""
        return None

    @property
    def _key_columns(self) -> list[str]:
        return list(self.keys) or ["singleton"]

    @property
    def quoted_keys(self) -> list[str]:
        """The key columns as quoted SQL identifiers (``singleton`` for a global state)."""
        return [quote_ident(c) for c in self._key_columns]

    @property
    def _qtable(self) -> str:
        return quote_ident(self.table)

    @property
    def _qstage(self) -> str:
        return quote_ident(self.stage_table)

    def definition(self) -> dict[str, Any]:
        return {
            "kind": StateKind(self.kind).value,
            "keys": dict(self.keys),
            "value_type": self.value_type,
            "combiner": self.combiner,
        }

    # -- DDL -------------------------------------------------------------------------------------

    def create(self, bind: Engine | Connection) -> MapState:
        """Create the state and staging tables if missing; refuse a contradicting definition."""
        from sqlalchemy.engine import Engine

        if isinstance(bind, Engine):
            with bind.begin() as conn:
                self._create(conn)
        else:
            self._create(bind)
        return self

    def _create(self, conn: Connection) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _DDL_LOCK_KEY})
        definition = self.definition()
        conn.execute(
            pg_insert(STATE_REGISTRY)
            .values(name=self.name, pipeline=self.pipeline, kind=self.kind, definition=definition)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        row = conn.execute(
            select(STATE_REGISTRY.c.pipeline, STATE_REGISTRY.c.definition).where(
                STATE_REGISTRY.c.name == self.name
            )
        ).one()
        if row.pipeline != self.pipeline or row.definition != definition:
            raise StateDefinitionError(
                f"state {self.name!r} exists as {row.definition} of pipeline {row.pipeline!r}; "
                f"declared as {definition} of pipeline {self.pipeline!r}",
                pipeline=self.pipeline,
            )
        existed = conn.execute(text("SELECT to_regclass(:t)"), {"t": self._qtable}).scalar()
        if self.keys:
            key_ddl = [f"{quote_ident(c)} {t} NOT NULL" for c, t in self.keys.items()]
        else:
            key_ddl = ["singleton boolean NOT NULL DEFAULT true CHECK (singleton)"]
        cols = [*key_ddl, f"value {self.value_type}", *self.rule.columns(self.value_type)]
        cols.append(f"PRIMARY KEY ({', '.join(self.quoted_keys)})")
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {self._qtable} ({', '.join(cols)}) "
                f"WITH (fillfactor = {int(self.fillfactor)})"
            )
        )
        if self.keys:
            self._create_summary(conn, fresh=existed is None)
        stage_cols = [
            # txid, attempt and job come from SET LOCAL settings: a COPY carries keys and delta.
            "txid bigint NOT NULL DEFAULT current_setting('txn.stage_txid')::bigint",
            "attempt integer NOT NULL DEFAULT current_setting('txn.stage_attempt')::integer",
            *[f"{quote_ident(c)} {t}" for c, t in self.keys.items()],
            f"delta {self.value_type}",
        ]
        conn.execute(
            text(f"CREATE UNLOGGED TABLE IF NOT EXISTS {self._qstage} ({', '.join(stage_cols)})")
        )
        # Added, not declared above, so that a staging table of an earlier version gains it too;
        # only when missing: ALTER TABLE locks out the txids staging meanwhile (create runs at
        # every begin).
        if not self._has_column(conn, STAGE_JOB_COLUMN):
            conn.execute(
                text(
                    f"ALTER TABLE {self._qstage} ADD COLUMN IF NOT EXISTS {STAGE_JOB_COLUMN} text "
                    "NOT NULL DEFAULT COALESCE(current_setting('txn.stage_job', true), '')"
                )
            )
        if self.value_type in _FLOAT_TYPES:
            # A NaN or infinite delta would poison the value for good: refused by the table too,
            # whoever writes it (staging refuses it earlier, naming the row).
            check = f"{self.stage_table}_finite_delta"[:63]
            exists = conn.execute(
                text(
                    "SELECT 1 FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass(:t)"
                ),
                {"c": check, "t": self._qstage},
            ).first()
            if exists is None:
                conn.execute(
                    text(
                        f"ALTER TABLE {self._qstage} ADD CONSTRAINT {quote_ident(check)} "
                        "CHECK (delta NOT IN ('NaN', 'Infinity', '-Infinity')) NOT VALID"
                    )
                )

    def _create_summary(self, conn: Connection, *, fresh: bool) -> None:
        """The summary row (keys, sum) each commit keeps (see :meth:`apply`).

        A table created just now starts a summary of its own (one left by a dropped table of the
        same name is stale); an existing one without a summary (created by an earlier version)
        gets one on its next commit. No index on the value: it would make every update of a key
        a non-HOT update (``make bench-core``: 1e5-key update apply ~0.45 s → ~0.72 s), on the
        commit path that runs one txid at a time; the page's top keys are a scan, rate-limited."""
        if fresh:
            conn.execute(delete(MAP_SUMMARY).where(MAP_SUMMARY.c.name == self.name))

    def summary(self, conn: Connection) -> tuple[int, Any] | None:
        """``(keys, sum of values)`` as the commits kept them, or ``None`` if no commit kept them
        yet (a state created by an earlier version, not committed to since). One row read."""
        row = conn.execute(
            select(MAP_SUMMARY.c["keys"], MAP_SUMMARY.c.total).where(
                MAP_SUMMARY.c.name == self.name
            )
        ).one_or_none()
        return None if row is None else (int(row.keys), row.total)

    def top(self, conn: Connection, k: int) -> list[tuple[Any, ...]]:
        """The ``k`` keys with the largest values, ``(keys…, value)``, largest first (ties by
        key): one scan of the table with a top-``k`` sort (the Transactions page rate-limits it,
        see ``ui.reader.TOP_KEYS_REFRESH_S``)."""
        columns = ", ".join(self.quoted_keys)
        rows = conn.execute(
            text(
                f"SELECT {columns}, value FROM {self._qtable} WHERE value IS NOT NULL "
                f"ORDER BY value DESC, {columns} LIMIT :n"
            ),
            {"n": k},
        )
        return [tuple(r) for r in rows]

    def _has_column(self, conn: Connection, column: str) -> bool:
        found = conn.execute(
            text(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(:t) "
                "AND attname = :c AND NOT attisdropped"
            ),
            {"t": self._qstage, "c": column},
        ).first()
        return found is not None

    # -- processing phase: stage -----------------------------------------------------------------

    def _malformed(
        self, txid: int, attempt: int, problem: str, row: Any = None
    ) -> MalformedOutputError:
        shown = None if row is None else repr(row)
        return MalformedOutputError(
            f"state {self.name!r}: {problem}"
            + (f" in staged row {shown}" if shown else "")
            + "; nothing was staged",
            pipeline=self.pipeline,
            txid=txid,
            attempt=attempt,
            state=self.name,
            row=shown,
        )

    def _refused(self, txid: int, attempt: int, refused: Refused) -> MalformedOutputError:
        return self._malformed(txid, attempt, refused.problem, refused.row)

    def stage(
        self,
        conn: Connection,
        txid: int,
        attempt: int,
        rows: Iterable[Sequence[Any]],
        *,
        job: str = "",
    ) -> int:
        """Stage ``(keys…, delta)`` rows of ``(txid, attempt)`` with one binary COPY; return the
        count.

        Replaces rows the same ``job`` of this attempt staged before (a duplicate run stages once,
        not twice); rows of other jobs of the attempt are kept. A batch outside the value domain
        (:mod:`~airflow_txn_provider.state.staging`: a null key, NUL in a text key, a key over
        the size limit, a null, NaN, infinite or fractional-into-integer delta, a batch sum out
        of range) is refused whole with :class:`MalformedOutputError`; an empty string key is a
        key like any other.
        """
        try:
            checked = check_rows(self.keys, self.value_type, self.combiner, rows)
        except Refused as refused:
            raise self._refused(txid, attempt, refused) from None
        return self._copy(conn, txid, attempt, checked, job)

    def stage_arrow(
        self, conn: Connection, txid: int, attempt: int, table: pa.Table, *, job: str = ""
    ) -> int:
        """Stage an Arrow table (columns: the key columns, then ``delta``) with one binary COPY.

        What a Spark job stages: ``DataFrame.toArrow()`` of its partial results. Checked against
        the value domain as :meth:`stage` is, naming the first offending row, before anything
        is staged.
        """
        columns = [*self.keys, "delta"]
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(
                f"state {self.name!r} stages columns {columns}; the result has "
                f"{table.column_names} (missing {missing})"
            )
        try:
            rows = arrow_rows(self.keys, self.value_type, self.combiner, table.select(columns))
        except Refused as refused:
            raise self._refused(txid, attempt, refused) from None
        return self._copy(conn, txid, attempt, rows, job)

    def _copy(
        self,
        conn: Connection,
        txid: int,
        attempt: int,
        rows: pa.Table | list[tuple[Any, ...]],
        job: str,
    ) -> int:
        try:
            return copy_rows(
                conn,
                self.stage_table,
                self.keys,
                self.value_type,
                txid,
                attempt,
                rows,
                job=job,
                quote=quote_ident,
            )
        except psycopg.errors.DataError as err:  # the domain checks should leave none: a net
            raise self._malformed(txid, attempt, f"COPY refused the rows: {err}") from err
        except psycopg.errors.IntegrityConstraintViolation as err:
            raise self._malformed(txid, attempt, f"COPY refused the rows: {err}") from err

    def staged_count(self, conn: Connection, txid: int, attempt: int) -> int:
        """How many rows ``(txid, attempt)`` staged, every job's."""
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {self._qstage} WHERE txid = :t AND attempt = :a"),
                {"t": txid, "a": attempt},
            ).scalar_one()
        )

    def staged(self, conn: Connection, txid: int, attempt: int) -> list[tuple[Any, ...]]:
        """The rows ``(keys…, delta)`` staged by ``(txid, attempt)``, sorted (for inspection)."""
        columns = ", ".join([*(quote_ident(c) for c in self.keys), "delta"])
        rows = conn.execute(
            text(
                f"SELECT {columns} FROM {self._qstage} "
                f"WHERE txid = :t AND attempt = :a ORDER BY {columns}"
            ),
            {"t": txid, "a": attempt},
        )
        return [tuple(r) for r in rows]

    # -- commit phase: apply ---------------------------------------------------------------------

    def apply(
        self, conn: Connection, txid: int, attempt: int, *, expected_rows: int | None = None
    ) -> ApplyResult:
        """Fold ``(txid, attempt)``'s staged rows (of every job) into the state: one statement.

        Also drops staged rows of this txid and older ones (every attempt). Run it inside the
        commit's database transaction (see :mod:`airflow_txn_provider.commit`).
        """
        combine, aggregate = _COMBINERS[self.combiner]
        key_list = ", ".join(self.quoted_keys)
        staged_keys = ", ".join(quote_ident(c) for c in self.keys)
        select_keys = f"{staged_keys}, " if self.keys else "true AS singleton, "
        group_by = f"GROUP BY {staged_keys}" if self.keys else "HAVING count(*) > 0"
        vt = self.value_type
        rows = '"txn:rows"'  # no key column can be named so (keys are [a-z_][a-z0-9_]*)
        # A map's key count and value sum move by this batch's deltas, in this statement: the
        # CTE "before" reads the batch's keys as they were (one snapshot), "upsert" as they are.
        summary_cte, summarised = "", "true"
        returned = "".join(f"s.{k}, " for k in self.quoted_keys)
        before_join = f"JOIN upsert u USING ({key_list})" if self.keys else "WHERE false"
        if self.keys:
            summary_cte = """, summary AS (
                UPDATE txn_map_summary SET
                    keys = keys + (SELECT count(*) FROM upsert) - (SELECT count(*) FROM before),
                    total = total + (SELECT coalesce(sum(value), 0) FROM upsert)
                                  - (SELECT coalesce(sum(value), 0) FROM before),
                    txid = :txid, updated_at = now()
                WHERE name = :name
                RETURNING 1
            )"""
            summarised = "EXISTS (SELECT 1 FROM summary)"

        def comb(a: str, b: str) -> str:
            return combine.format(a=a, b=b)

        upsert = self.rule.upsert(comb, self.combiner)
        sql = f"""
            WITH batch AS (
                SELECT {select_keys}CAST({aggregate}(delta) AS {vt}) AS delta, count(*) AS {rows}
                FROM {self._qstage}
                WHERE txid = :txid AND attempt = :attempt
                {group_by}
            ), upsert AS (
                INSERT INTO {self._qtable} AS s ({key_list}, {upsert.columns})
                SELECT {key_list}, {upsert.values} FROM batch ORDER BY {key_list}
                ON CONFLICT ({key_list}) DO UPDATE SET {upsert.update} {upsert.guard}
                RETURNING {returned}s.value
            ), before AS (
                -- the statement's snapshot: the written keys' values before this commit (a key
                -- the guard skipped is in neither side)
                SELECT s.value FROM {self._qtable} s {before_join}
            ), cleanup AS (
                DELETE FROM {self._qstage} WHERE txid <= :txid
            ){summary_cte}
            SELECT (SELECT count(*) FROM batch) AS keys,
                   (SELECT count(*) FROM upsert) AS written,
                   (SELECT coalesce(sum({rows}), 0) FROM batch) AS staged,
                   {summarised} AS summarised
        """
        # Aggregating and sorting a large batch in memory instead of spilling to disk (default 4MB).
        conn.execute(text("SELECT set_config('work_mem', '256MB', true)"))
        try:
            with conn.begin_nested():  # a savepoint: an overflow leaves the commit usable
                row = conn.execute(
                    text(sql), {"txid": txid, "attempt": attempt, "name": self.name}
                ).one()
        except DataError as err:
            if sqlstate(err) != NUMERIC_OUT_OF_RANGE:
                raise
            raise self._out_of_range(conn, txid, attempt) from err
        if expected_rows is not None and int(row.staged) != expected_rows:
            raise StagedOutputMismatchError(
                f"state {self.name!r}: {row.staged} staged rows found, the attempt recorded "
                f"{expected_rows} (staging lost, e.g. after a Postgres crash); replay the txid",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        if int(row.written) != int(row.keys):
            newest = conn.execute(text(f"SELECT max(txid) FROM {self._qtable}")).scalar_one()
            raise StateAheadOfLogError(
                f"state {self.name!r} holds {int(row.keys) - int(row.written)} key(s) updated by "
                f"a later txid (newest stored txid {newest}); state and transaction log disagree",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        if not row.summarised:  # no summary yet (a state of an earlier version): count once
            conn.execute(
                text(
                    "INSERT INTO txn_map_summary (name, keys, total, txid) "
                    f"SELECT :name, count(*), coalesce(sum(value), 0), :txid FROM {self._qtable} "
                    "ON CONFLICT (name) DO UPDATE SET keys = EXCLUDED.keys, "
                    "total = EXCLUDED.total, txid = EXCLUDED.txid, updated_at = now()"
                ),
                {"name": self.name, "txid": txid},
            )
        return ApplyResult(staged_rows=int(row.staged), keys=int(row.keys))

    def _out_of_range(self, conn: Connection, txid: int, attempt: int) -> TxnError:
        """The typed error of a commit whose sum leaves the value type's range, naming a key
        (found in the error path only: one aggregate over the batch and its stored values)."""
        keys = ", ".join(quote_ident(c) for c in self.keys)
        by = f"GROUP BY {keys}" if self.keys else ""
        select_keys = f"b.{', b.'.join(quote_ident(c) for c in self.keys)}" if self.keys else "1"
        joined = (
            f"LEFT JOIN {self._qtable} s USING ({keys})"
            if self.keys
            else (f"LEFT JOIN {self._qtable} s ON true")
        )
        found = conn.execute(
            text(
                f"""
                WITH b AS (
                    SELECT {keys + ", " if self.keys else ""}sum(delta::numeric) AS delta
                    FROM {self._qstage} WHERE txid = :t AND attempt = :a {by}
                )
                SELECT {select_keys}, coalesce(s.value::numeric, 0) + b.delta AS total
                FROM b {joined}
                ORDER BY abs(coalesce(s.value::numeric, 0) + b.delta) DESC LIMIT 1
                """
            ),
            {"t": txid, "a": attempt},
        ).first()
        key = None if found is None else repr(tuple(found)[:-1])
        total = None if found is None else found[-1]
        return StateValueOutOfRangeError(
            f"state {self.name!r}: the commit takes key {key} to {total}, out of "
            f"{self.value_type}'s range",
            pipeline=self.pipeline,
            txid=txid,
            attempt=attempt,
            state=self.name,
            key=key,
        )

    # -- reading ---------------------------------------------------------------------------------

    def items(self, conn: Connection) -> dict[tuple[Any, ...], Any]:
        """The whole map: ``{(key values…): value}``."""
        rows = conn.execute(
            text(f"SELECT {', '.join(self.quoted_keys)}, value FROM {self._qtable}")
        )
        return {tuple(r[:-1]): r[-1] for r in rows}

    def rows(self, conn: Connection) -> list[dict[str, Any]]:
        """Every stored row with its bookkeeping columns (txid, prev_value), for inspection."""
        rows = conn.execute(
            text(f"SELECT * FROM {self._qtable} ORDER BY {', '.join(self.quoted_keys)}")
        )
        return [dict(r._mapping) for r in rows]

    def get(self, conn: Connection, keys: Sequence[Sequence[Any]]) -> dict[tuple[Any, ...], Any]:
        """Values of ``keys`` (missing keys are absent from the result), in one query."""
        if not keys:
            return {}
        if not self.keys:
            return self.items(conn)
        cols = ", ".join(quote_ident(c) for c in self.keys)
        params: dict[str, Any] = {}
        tuples = []
        for i, key in enumerate(keys):
            names = []
            for j, value in enumerate(key):
                params[f"k{i}_{j}"] = value
                names.append(f":k{i}_{j}")
            tuples.append(f"({', '.join(names)})")
        sql = f"SELECT {cols}, value FROM {self._qtable} WHERE ({cols}) IN ({', '.join(tuples)})"
        return {tuple(r[:-1]): r[-1] for r in conn.execute(text(sql), params)}


class GlobalState(MapState):
    """A single value (Trident's Snapshottable; Storm's TransactionalGlobalCount)."""

    def __init__(
        self,
        pipeline: str,
        name: str,
        kind: StateKind | str = StateKind.TRANSACTIONAL,
        value_type: str = "bigint",
        combiner: str = "sum",
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            name=name,
            kind=kind,
            keys={},
            value_type=value_type,
            combiner=combiner,
            fillfactor=100,
        )

    def stage_value(
        self, conn: Connection, txid: int, attempt: int, delta: Any, *, job: str = ""
    ) -> int:
        return self.stage(conn, txid, attempt, [(delta,)], job=job)

    def value(self, conn: Connection) -> Any:
        return conn.execute(text(f"SELECT value FROM {self._qtable}")).scalar_one_or_none()


@dataclass(frozen=True, eq=False, init=False)  # fields for `of` and `bucket_size`, its own __init__
class BucketCountState(MapState):
    """How many keys of another state have a value in each bucket ``value // bucket_size``.

    Storm's TransactionalWords keeps word counts and, in the same transaction, how many words
    fall in each count bucket (0-9, 10-19, …). A word moving from bucket 0 to bucket 1 takes one
    from bucket 0 and adds one to bucket 1, which needs its committed count before the batch:
    :meth:`derive` computes those moves inside the commit, from the source state's staged deltas
    and committed values, and stages them as this state's batch. Key column: ``bucket``.

    :param of: the state whose keys are counted; a keyed state with the ``sum`` combiner, of the
        same pipeline.
    :param bucket_size: width of a bucket (values 0..bucket_size-1 are bucket 0).
    """

    of: str = ""
    bucket_size: int = 10

    def __init__(
        self,
        pipeline: str,
        name: str,
        of: str,
        bucket_size: int = 10,
        kind: StateKind | str = StateKind.TRANSACTIONAL,
    ) -> None:
        _ident(of, "source state name")
        if of == name:
            raise ValueError(f"state {name!r} cannot count its own buckets")
        if int(bucket_size) < 1:
            raise ValueError(f"bucket_size must be >= 1, got {bucket_size!r}")
        # Its own fields first: the base class's checks run in __post_init__.
        object.__setattr__(self, "of", of)
        object.__setattr__(self, "bucket_size", int(bucket_size))
        super().__init__(pipeline=pipeline, name=name, kind=kind, keys={"bucket": "bigint"})

    @property
    def derived_from(self) -> str | None:
        return self.of

    def definition(self) -> dict[str, Any]:
        derived = {"bucket_counts_of": self.of, "bucket_size": self.bucket_size}
        return {**super().definition(), **derived}

    def derive(self, conn: Connection, txid: int, attempt: int, source: MapState) -> int:
        """Stage this txid's bucket moves, computed from ``source`` before it applies the txid.

        Must run in the commit's database transaction and before ``source.apply``: the log
        commits a txid once, so the committed values read here are those before this txid.
        """
        if (
            source.name != self.of
            or not source.keys
            or source.combiner != "sum"
            or source.derived_from is not None  # its stage rows are written at commit time too
        ):
            raise StateDefinitionError(
                f"bucket state {self.name!r} counts state {self.of!r}, which must be a keyed "
                f"state with the sum combiner, not itself derived (got {source.name!r}: keys "
                f"{list(source.keys)}, "
                f"combiner {source.combiner!r})",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        keys = ", ".join(quote_ident(c) for c in source.keys)
        conn.execute(
            text(f"DELETE FROM {self._qstage} WHERE txid = :t AND attempt = :a"),
            {"t": txid, "a": attempt},
        )
        result = conn.execute(
            text(
                f"""
                WITH batch AS (
                    SELECT {keys}, sum(delta) AS delta FROM {source._qstage}
                    WHERE txid = :t AND attempt = :a GROUP BY {keys}
                ), moved AS (
                    SELECT s.value AS old, COALESCE(s.value, 0) + b.delta AS new
                    FROM batch b LEFT JOIN {source._qtable} s USING ({keys})
                ), moves AS (
                    SELECT floor(old::numeric / :size) AS bucket, -1 AS d FROM moved
                    WHERE old IS NOT NULL
                    UNION ALL
                    SELECT floor(new::numeric / :size), 1 FROM moved
                )
                INSERT INTO {self._qstage} (txid, attempt, bucket, delta)
                SELECT :t, :a, bucket, sum(d) FROM moves GROUP BY bucket HAVING sum(d) <> 0
                """
            ),
            {"t": txid, "a": attempt, "size": self.bucket_size},
        )
        return int(result.rowcount)


def load_states(bind: Engine | Connection, pipeline: str) -> dict[str, MapState]:
    """Every state registered for ``pipeline``, by name."""
    return {state.name: state for state in _load(bind, STATE_REGISTRY.c.pipeline == pipeline)}


def _load(bind: Engine | Connection, where: ColumnElement[bool]) -> list[MapState]:
    from sqlalchemy.engine import Engine

    query = select(STATE_REGISTRY).where(where).order_by(STATE_REGISTRY.c.name)
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            rows = conn.execute(query).all()
    else:
        rows = bind.execute(query).all()
    return [_from_definition(row.pipeline, row.name, row.definition) for row in rows]


def _from_definition(pipeline: str, name: str, d: Mapping[str, Any]) -> MapState:
    """The state a registry row declares (the inverse of :meth:`MapState.definition`)."""
    if "bucket_counts_of" in d:
        return BucketCountState(pipeline, name, d["bucket_counts_of"], d["bucket_size"], d["kind"])
    if d["keys"]:
        return MapState(pipeline, name, d["kind"], d["keys"], d["value_type"], d["combiner"])
    return GlobalState(pipeline, name, d["kind"], d["value_type"], d["combiner"])


def stage_states(
    conn: Connection,
    txid: int,
    attempt: int,
    batches: Mapping[MapState, Iterable[Sequence[Any]]],
    *,
    job: str = "",
) -> dict[str, int]:
    """Stage several states' rows; return the output reference to record (row count per state).

    :param job: names the job staging, when several jobs of a txid stage (see
        :meth:`MapState.stage`).
    """
    return {
        state.output_key: state.stage(conn, txid, attempt, rows, job=job)
        for state, rows in batches.items()
    }
