"""What the Transactions page shows of a state's past (issue 61): what a txid changed, a key's
history, a state as of a chosen txid.

The reads are the state's own (:mod:`airflow_txn_provider.state.as_of`, from the undo records each
commit writes): each is one statement or one REPEATABLE READ snapshot, so it is consistent while
the pipeline keeps committing, and bounded (``limit``, at most :data:`MAX_LIMIT`). This module
parses what a user types (a key's column values, :func:`parse_key`), reads, and shapes the rows
as plain JSON (the same dict feeds the templates and the JSON endpoints). A txid older than the
undo records retention keeps is refused by the reads with
:class:`~airflow_txn_provider.rules.exceptions.StateTxidNotReadableError`: the endpoints answer
409 with its message, the txid's page says it in a sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from airflow_txn_provider.compat.python import UTC, fromisoformat
from airflow_txn_provider.rules.exceptions import StateTxidNotReadableError, UnknownPipelineError
from airflow_txn_provider.state import GlobalState, load_states
from airflow_txn_provider.state.as_of import BOUNDS, as_of_floor, as_of_select, check_readable
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.ui import model
from airflow_txn_provider.ui.errors import StateKeyError, UnknownStateError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from airflow_txn_provider.state import MapState
    from airflow_txn_provider.state.as_of import KeyChange, TxidChange

CHANGES_LIMIT = 20
"""How many keys a txid's page shows per state of what it changed (the largest changes)."""
HISTORY_LIMIT = 50
"""How many txids a key's history lists unless asked for another number."""
AS_OF_LIMIT = 20
"""How many of a state's largest values its view as of a txid lists unless asked."""
MAX_LIMIT = 500
"""The most any of these reads returns."""
GLOBAL_KEY = "(value)"
"""How a global state's one key is labelled (it has no key columns)."""

_INTEGERS = {"smallint": 2**15, "integer": 2**31, "bigint": 2**63}
_TRUE = {"t", "true", "y", "yes", "on", "1"}
_FALSE = {"f", "false", "n", "no", "off", "0"}


# -- what a user types -------------------------------------------------------------------------


def parse_key_value(column: str, sqltype: str, value: str) -> Any:
    """``value``, typed into the page for key column ``column``, as the Python value of its SQL
    type; :class:`ValueError` saying what the column takes when it is not one."""
    try:
        if sqltype in _INTEGERS:
            n = int(value.strip())
            if not -_INTEGERS[sqltype] <= n < _INTEGERS[sqltype]:
                raise ValueError("out of range")
            return n
        if sqltype == "boolean":
            word = value.strip().lower()
            if word in _TRUE | _FALSE:
                return word in _TRUE
            raise ValueError("not a boolean")
        if sqltype == "date":
            return date.fromisoformat(value.strip())
        if sqltype == "timestamptz":
            when = fromisoformat(value.strip())
            return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        if sqltype == "numeric":
            return Decimal(value.strip())
        if sqltype == "double precision":
            return float(value.strip())
    except (ValueError, InvalidOperation) as err:
        raise ValueError(
            f"key column {column!r} is of type {sqltype}: {value!r} is not one"
        ) from err
    return value  # text: as typed


def parse_key(state: MapState, values: Sequence[str]) -> tuple[Any, ...]:
    """The key of ``state`` that ``values`` (one per key column, in order) name; a global state's
    one key when none is given. :class:`~airflow_txn_provider.ui.errors.StateKeyError` when they
    do not fit its key columns."""
    columns = dict(state.keys)
    if isinstance(state, GlobalState) or not columns:
        if values:
            raise StateKeyError(
                f"state {state.name!r} is global: it has one value and no key to give",
                pipeline=state.pipeline,
                state=state.name,
            )
        return (True,)
    if len(values) != len(columns):
        raise StateKeyError(
            f"state {state.name!r} is keyed by {', '.join(columns)}: give one value per column "
            f"(key=…&key=…, in that order), got {len(values)}",
            pipeline=state.pipeline,
            state=state.name,
        )
    try:
        return tuple(
            parse_key_value(c, t, v) for (c, t), v in zip(columns.items(), values, strict=True)
        )
    except ValueError as err:
        raise StateKeyError(str(err), pipeline=state.pipeline, state=state.name) from err


# -- shaping (pure) ----------------------------------------------------------------------------


def json_key_part(value: Any) -> Any:
    """A key column's value as JSON: dates and times in ISO, numbers as numbers."""
    if isinstance(value, datetime):
        return model.iso(value)
    if isinstance(value, date):
        return value.isoformat()
    return model.json_number(value)


def key_text(key: Sequence[Any], *, is_global: bool = False) -> str:
    """A key as the page shows it: its columns' values, or :data:`GLOBAL_KEY`."""
    return GLOBAL_KEY if is_global else model.key_label([json_key_part(k) for k in key])


def change_of(before: Any, after: Any) -> Any:
    """``after - before`` (an absent key counts as 0), ``None`` when neither is known."""
    if before is None and after is None:
        return None
    return model.json_number((after or 0) - (before or 0))


def signed(change: Any) -> str:
    """A change as the page shows it: ``+3``, ``-2``, ``0``; ``—`` when unknown. The page's
    script has the same (``signed`` in ``static/txn.js``)."""
    if change is None:
        return "—"
    return f"+{change}" if change > 0 else str(change)


def change_row(c: TxidChange, *, is_global: bool = False) -> dict[str, Any]:
    """A key a txid touched: its value before and after the commit (``None``: absent), and the
    change."""
    return {
        "key": key_text(c.key, is_global=is_global),
        "key_values": [] if is_global else [json_key_part(k) for k in c.key],
        "before": model.json_number(c.before),
        "after": model.json_number(c.after),
        "change": change_of(c.before, c.after),
    }


def history_row(c: KeyChange) -> dict[str, Any]:
    """A txid that changed a key: the attempt that committed it, when, before, after."""
    return {
        "txid": c.txid,
        "run_id": txid_run_id(c.txid),
        "attempt": c.attempt,
        "committed_at": model.iso(c.committed_at),
        "before": model.json_number(c.before),
        "after": model.json_number(c.after),
        "change": change_of(c.before, c.after),
    }


def bounded(rows: Sequence[Any], limit: int) -> tuple[list[Any], bool]:
    """The first ``limit`` of ``rows`` (read ``limit + 1`` of them) and whether there were more."""
    return list(rows[:limit]), len(rows) > limit


def reach_text(floor: int, last_committed: int) -> str:
    """Which txids a key's history covers: those after the oldest txid a state is read as of."""
    first = floor + 1
    if first > last_committed:
        return "no committed txid is kept"
    return f"txids {first} … {last_committed} are kept"


def not_committed_changes(txid: int, last_committed: int, limit: int) -> dict[str, Any]:
    """What a txid not committed yet changed: nothing yet."""
    return {
        "status": "not_committed",
        "message": f"txid {txid} has not committed (the last committed txid is "
        f"{last_committed}): it changed no state yet",
        "limit": limit,
        "states": [],
    }


def refused_changes(err: StateTxidNotReadableError, limit: int) -> dict[str, Any]:
    """What a txid changed, refused beyond retention: the typed error's message, short."""
    return {"status": "refused", "message": err.detail, "limit": limit, "states": []}


def state_changes(state: MapState, changes: Sequence[TxidChange], limit: int) -> dict[str, Any]:
    """One state's keys a txid touched (read ``limit + 1``: whether more changed)."""
    shown, more = bounded(changes, limit)
    is_global = isinstance(state, GlobalState)
    return {
        "name": state.name,
        "kind": str(state.kind),
        "type": "global" if is_global else "map",
        "key_columns": list(state.keys),
        "changes": [change_row(c, is_global=is_global) for c in shown],
        "more": more,
    }


# -- reads -------------------------------------------------------------------------------------


def find_state(conn: Connection, pipeline: str, name: str) -> MapState:
    """``pipeline``'s state ``name``; 404s: no such pipeline, no such state."""
    found = load_states(conn, pipeline).get(name)
    if found is not None:
        return found
    if conn.execute(text(BOUNDS), {"pipeline": pipeline}).first() is None:
        raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
    raise UnknownStateError(
        f"pipeline {pipeline!r} has no state {name!r}", pipeline=pipeline, state=name
    )


def _snapshot(engine: Engine) -> Connection:
    return engine.connect().execution_options(isolation_level="REPEATABLE READ")


def history_payload(
    engine: Engine,
    pipeline: str,
    name: str,
    key_values: Sequence[str],
    now: datetime,
    limit: int = HISTORY_LIMIT,
) -> dict[str, Any]:
    """A key's history: each kept txid that changed it, newest first, at most ``limit``, with
    the key's value now; in one snapshot."""
    with _snapshot(engine) as conn, conn.begin():
        state = find_state(conn, pipeline, name)
        key = parse_key(state, key_values)
        bounds = conn.execute(text(BOUNDS), {"pipeline": pipeline}).one()
        last, pruned, undo_from = (int(b) for b in bounds)
        found = state.history(conn, key, limit=limit + 1)
        current = state.get(conn, [key]).get(key)
    shown, more = bounded(found, limit)
    floor = as_of_floor(pruned, undo_from)
    is_global = isinstance(state, GlobalState)
    return {
        "pipeline": pipeline,
        "state": name,
        "type": "global" if is_global else "map",
        "key_columns": list(state.keys),
        "key": [] if is_global else [json_key_part(k) for k in key],
        "key_label": key_text(key, is_global=is_global),
        "current": model.json_number(current),
        "limit": limit,
        "history": [history_row(c) for c in shown],
        "more": more,
        "floor": floor,
        "last_committed": last,
        "reach": reach_text(floor, last),
        "now": model.iso(now),
    }


def top_as_of(
    conn: Connection, state: MapState, txid: int, limit: int
) -> tuple[int, Any, list[tuple[Any, ...]], tuple[int, int]]:
    """``state`` as of ``txid`` in one statement: its key count, its sum, its ``limit`` largest
    values ``(keys…, value)`` (largest first, ties by key, as the card's top keys), and the
    oldest and newest txid it can be read as of. Refused as
    :meth:`~airflow_txn_provider.state.maps.MapState.as_of` is."""
    t = state.backing
    keys = ", ".join(f"r.{k}" for k in t.quoted_keys)
    sql = f"""
        WITH "txn:bounds" AS ({BOUNDS}),
        "txn:rows" AS ({as_of_select(t, "CAST(:n AS bigint)")}),
        "txn:top" AS (
            SELECT r.*, count(*) OVER () AS "txn:count", sum(r.value) OVER () AS "txn:sum"
            FROM "txn:rows" r ORDER BY r.value DESC NULLS LAST, {keys} LIMIT :limit
        )
        SELECT * FROM "txn:bounds" b LEFT JOIN "txn:top" r ON true
        ORDER BY r.value DESC NULLS LAST, {keys}"""
    rows = conn.execute(
        text(sql), {"pipeline": state.pipeline, "n": int(txid), "limit": int(limit)}
    ).all()
    bounds = rows[0][:3] if rows else None
    check_readable(state.pipeline, state.name, txid, bounds, what=f"as of {txid}")
    assert bounds is not None  # check_readable refuses a pipeline without bounds
    width = len(t.quoted_keys)
    kept = [r for r in rows if r[3] is not None]
    count = int(kept[0][4 + width]) if kept else 0
    total = kept[0][5 + width] if kept else None
    top = [tuple(r[3 : 4 + width]) for r in kept if r[3 + width] is not None]
    last, pruned, undo_from = (int(b) for b in bounds)
    return count, total, top, (as_of_floor(pruned, undo_from), last)


def as_of_payload(
    engine: Engine, pipeline: str, name: str, txid: int, now: datetime, limit: int = AS_OF_LIMIT
) -> dict[str, Any]:
    """A state as it stood right after ``txid``: a global state's value; a map state's key
    count, sum and ``limit`` largest values. Refuses a txid beyond retention (or not committed)
    with :class:`StateTxidNotReadableError`."""
    with _snapshot(engine) as conn, conn.begin():
        state = find_state(conn, pipeline, name)
        base = {"pipeline": pipeline, "state": name, "txid": txid, "now": model.iso(now)}
        if isinstance(state, GlobalState):
            value = state.value_as_of(conn, txid)
            return {**base, "type": "global", "value": model.json_number(value)}
        count, total, top, (floor, last) = top_as_of(conn, state, txid, limit)
    return {
        **base,
        "type": "map",
        "key_columns": list(state.keys),
        "keys": count,
        "sum": model.json_number(total) if total is not None else 0,
        "limit": limit,
        "top": [
            {
                "key": key_text(row[:-1]),
                "key_values": [json_key_part(k) for k in row[:-1]],
                "value": model.json_number(row[-1]),
            }
            for row in top
        ],
        "floor": floor,
        "last_committed": last,
    }


_CHANGES_CACHE: dict[Any, dict[str, Any]] = {}
_CHANGES_CACHE_SIZE = 256
"""What a committed attempt of a txid changed never changes (a rewind to it commits another
attempt): its page's refreshes read it once."""


def read_txid_changes(engine: Engine, pipeline: str, txid: int, limit: int) -> list[dict[str, Any]]:
    """What ``txid`` changed in each state of ``pipeline`` (registry order), the largest
    ``limit`` changes of each, in one REPEATABLE READ snapshot; a state whose tables cannot be
    read says why (a savepoint each: the others are still read). Refused beyond retention."""
    found = []
    with _snapshot(engine) as conn, conn.begin():
        for state in load_states(conn, pipeline).values():
            try:
                with conn.begin_nested():
                    changes = state.changes(conn, txid, limit=limit + 1)
            except (OperationalError, InterfaceError):
                raise  # the database, not this state: a 503
            except SQLAlchemyError as err:
                detail = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
                found.append(model.state_error(state.name, detail))
                continue
            found.append(state_changes(state, changes, limit))
    return found


def txid_changes_payload(
    engine: Engine,
    pipeline: str,
    txid: int,
    last_committed: int,
    committed: tuple[int, datetime | None] | None,
    limit: int = CHANGES_LIMIT,
) -> dict[str, Any]:
    """What ``txid`` changed, per state, for its page: ``status`` ``ok`` with ``states`` (each
    with its largest ``limit`` changes, ``more`` when it touched more keys), ``not_committed``,
    or ``refused`` beyond retention with the typed error's message. ``committed``: its current
    ``(attempt, committed_at)``, what a cached read is valid for (``None``: not cached)."""
    if txid > last_committed:
        return not_committed_changes(txid, last_committed, limit)
    url = engine.url.render_as_string(hide_password=True)
    key = (url, pipeline, txid, committed, limit) if committed is not None else None
    cached = _CHANGES_CACHE.get(key) if key is not None else None
    if cached is not None:
        return cached
    try:
        states = read_txid_changes(engine, pipeline, txid, limit)
    except StateTxidNotReadableError as err:
        return refused_changes(err, limit)
    payload = {"status": "ok", "message": None, "limit": limit, "states": states}
    if key is not None and not any(s.get("type") == "error" for s in states):
        if len(_CHANGES_CACHE) >= _CHANGES_CACHE_SIZE:
            _CHANGES_CACHE.clear()
        _CHANGES_CACHE[key] = payload
    return payload


__all__ = [
    "AS_OF_LIMIT",
    "CHANGES_LIMIT",
    "HISTORY_LIMIT",
    "MAX_LIMIT",
    "as_of_payload",
    "history_payload",
    "parse_key",
    "parse_key_value",
    "txid_changes_payload",
]
