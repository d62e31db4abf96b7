"""A state's staged rows audited before its commit (issue 60), in the commit's transaction.

:func:`measure` checks every expectation on one state with ONE set-based query over the txid's
staged rows (their count and each condition's failing rows; a few failing keys only where some
fail); :func:`quarantine` moves the rows failing ``drop`` expectations out of staging into
``txn_quarantine``, stamped with pipeline, state, txid and attempt. A condition sees a staged
row's columns: the state's keys and ``delta`` (the batch's partial value for the key).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from airflow_txn_provider.rules.expectations import (
    FAILING_ROWS,
    SAMPLE_KEYS,
    Check,
    Expectation,
    FailingShare,
    Measured,
    RowCondition,
)
from airflow_txn_provider.rules.names import quote_ident
from airflow_txn_provider.utils.retries import is_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.state.maps import MapState

QUARANTINE_DROPPED = ("txid", "attempt", "stage_job")
"""Staging's bookkeeping columns, left out of a quarantined row (its stamp says them)."""


_STAGED = "txid = :t AND attempt = :a"


class Uncheckable(Exception):
    """An expectation Postgres could not evaluate (a condition naming a missing column, a type
    error): ``expectation`` names it, the message is Postgres's."""

    def __init__(self, expectation: str, problem: str) -> None:
        super().__init__(problem)
        self.expectation = expectation


def _failing(exp: Expectation) -> str | None:
    """SQL true for a row failing ``exp``'s condition (``None``: it has no condition)."""
    return (
        FAILING_ROWS.format(exp.condition) if isinstance(exp, RowCondition | FailingShare) else None
    )


def _key_text(state: MapState) -> str:
    keys = [f"{quote_ident(c)}::text" for c in state.keys] or ["delta::text"]
    return keys[0] if len(keys) == 1 else f"concat_ws(', ', {', '.join(keys)})"


def measure(
    conn: Connection, state: MapState, txid: int, attempt: int, expectations: Sequence[Expectation]
) -> tuple[int, list[Measured]]:
    """The staged row count of ``(txid, attempt)`` in ``state`` and each expectation measured on
    those rows. Raises :class:`Uncheckable` naming an expectation Postgres refused."""
    where = _STAGED
    conditions = [(e, f) for e in expectations if (f := _failing(e)) is not None]
    counts = ", ".join(["count(*)", *(f"count(*) FILTER (WHERE {f})" for _, f in conditions)])
    params = {"t": txid, "a": attempt}
    sql = f"SELECT {counts} FROM {state.backing.qstage} WHERE {where}"
    row = _evaluated(conn, sql, params, conditions, state)
    n, failed = int(row[0]), {e.name: int(c) for (e, _), c in zip(conditions, row[1:], strict=True)}
    measured = []
    for exp in expectations:
        if isinstance(exp, Check):
            measured.append(_checked(conn, state, exp, txid, attempt))
            continue
        bad, keys = failed.get(exp.name, 0), ()
        if bad:
            keys = tuple(
                conn.execute(
                    text(
                        f"SELECT {_key_text(state)} FROM {state.backing.qstage} "
                        f"WHERE {where} AND {_failing(exp)} ORDER BY 1 LIMIT {SAMPLE_KEYS}"
                    ),
                    params,
                ).scalars()
            )
        measured.append(Measured(exp.name, n, bad, keys))
    return n, measured


def _evaluated(
    conn: Connection,
    sql: str,
    params: dict[str, Any],
    conditions: Sequence[tuple[Expectation, str]],
    state: MapState,
) -> Sequence[Any]:
    """``sql``'s one row; if Postgres refuses it, which condition it refused (each tried alone in
    a savepoint, so the commit's transaction stays usable for the error's record)."""
    try:
        with conn.begin_nested():
            return conn.execute(text(sql), params).one()
    except DBAPIError as err:
        if is_transient(err):
            raise
        stage = state.backing.qstage
        for exp, failing in conditions:
            one = f"SELECT count(*) FILTER (WHERE {failing}) FROM {stage} WHERE {_STAGED}"
            try:
                with conn.begin_nested():
                    conn.execute(text(one), params)
            except DBAPIError as refused:
                raise Uncheckable(exp.name, _first_line(refused)) from refused
        raise  # not one condition's: the state's own (a staging table gone)


def _first_line(err: DBAPIError) -> str:
    return str(err.orig or err).strip().splitlines()[0]


def _checked(conn: Connection, state: MapState, check: Check, txid: int, attempt: int) -> Measured:
    """A :class:`Check` given the staged rows (``{key: …, "delta": …}`` each, by key order)."""
    columns = [*(quote_ident(c) for c in state.keys), "delta"]
    rows = [
        dict(r._mapping)
        for r in conn.execute(
            text(
                f"SELECT {', '.join(columns)} FROM {state.backing.qstage} "
                f"WHERE {_STAGED} ORDER BY {', '.join(columns)}"
            ),
            {"t": txid, "a": attempt},
        )
    ]
    return check.measure(rows)


def quarantine(
    conn: Connection,
    state: MapState,
    txid: int,
    attempt: int,
    drops: Sequence[RowCondition],
    *,
    staged_attempt: int | None = None,
) -> int:
    """Move the rows of ``(txid, staged_attempt)`` failing any of ``drops`` from staging to
    ``txn_quarantine`` (stamped with ``attempt``, each with the expectations it fails) in one
    statement; returns how many."""
    if not drops:
        return 0
    failing = [FAILING_ROWS.format(d.condition) for d in drops]
    names = {f"n{i}": d.name for i, d in enumerate(drops)}
    which = ", ".join(f"CASE WHEN {f} THEN :n{i} END" for i, f in enumerate(failing))
    stamp = " - ".join(["to_jsonb(gone)", *(f"'{c}'" for c in QUARANTINE_DROPPED)])
    moved = conn.execute(
        text(
            f"WITH gone AS (DELETE FROM {state.backing.qstage} WHERE txid = :t AND attempt = :sa "
            f"AND ({' OR '.join(failing)}) RETURNING *) "
            "INSERT INTO txn_quarantine (pipeline, output, txid, attempt, expectations, row) "
            f"SELECT :p, :o, :t, :a, array_remove(ARRAY[{which}]::text[], NULL), {stamp} "
            "FROM gone"
        ),
        {
            "t": txid,
            "sa": attempt if staged_attempt is None else staged_attempt,
            "a": attempt,
            "p": state.pipeline,
            "o": state.name,
            **names,
        },
    )
    return int(moved.rowcount)


__all__ = ["QUARANTINE_DROPPED", "Uncheckable", "measure", "quarantine"]
