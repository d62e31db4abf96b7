"""What the log keeps of the audit before each commit (issue 60): each attempt's outcomes (written
by :meth:`~airflow_txn_provider.log.rows.TxidRows.record_expectations`), read back here as the
history a sigma bound is judged against and as a trend; and the quarantine, which a rewind takes
back with its txids. Every function runs in the caller's database transaction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, text

from airflow_txn_provider.log.models import (
    ATTEMPTS,
    QUARANTINE,
    QUARANTINE_STAGING,
    TRANSACTIONS,
)
from airflow_txn_provider.rules.expectations import NOT_MEASURED
from airflow_txn_provider.rules.vocabulary import TxStatus

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy.engine import Connection


def committed_outcomes(
    conn: Connection, pipeline: str, last: int, *, before_txid: int | None = None
) -> list[tuple[int, list[Mapping[str, Any]]]]:
    """The outcomes recorded by the committed attempts of the newest ``last`` committed txids
    (before ``before_txid``) that recorded any, oldest first: ``[(txid, outcomes), ...]``."""
    query = (
        select(TRANSACTIONS.c.txid, ATTEMPTS.c.expectations)
        .join(
            ATTEMPTS,
            (ATTEMPTS.c.pipeline == TRANSACTIONS.c.pipeline)
            & (ATTEMPTS.c.txid == TRANSACTIONS.c.txid)
            & (ATTEMPTS.c.attempt == TRANSACTIONS.c.attempt),
        )
        .where(
            TRANSACTIONS.c.pipeline == pipeline,
            TRANSACTIONS.c.status == TxStatus.COMMITTED,
            ATTEMPTS.c.expectations.is_not(None),
        )
        .order_by(TRANSACTIONS.c.txid.desc())
        .limit(last)
    )
    if before_txid is not None:
        query = query.where(TRANSACTIONS.c.txid < before_txid)
    return [(int(t), list(e)) for t, e in reversed(conn.execute(query).all())]


def committed_counts(
    conn: Connection, pipeline: str, names: Iterable[str], last: int, *, before_txid: int
) -> dict[str, list[int]]:
    """Per expectation name, the rows it checked in the newest ``last`` committed txids before
    ``before_txid`` that checked it, oldest first: a sigma bound's history."""
    wanted = set(names)
    counts: dict[str, list[int]] = {name: [] for name in wanted}
    for _, outcomes in committed_outcomes(conn, pipeline, last, before_txid=before_txid):
        for outcome in outcomes:  # one never measured counted no rows: not a count
            if outcome.get("expectation") in wanted and outcome.get("message") != NOT_MEASURED:
                counts[outcome["expectation"]].append(int(outcome["rows_checked"]))
    return counts


@dataclass(frozen=True)
class QuarantinedRow:
    """A row a ``drop`` expectation took out of a txid's output."""

    output: str
    txid: int
    attempt: int
    expectations: tuple[str, ...]
    row: Mapping[str, Any]
    quarantined_at: datetime


def quarantined(
    conn: Connection, pipeline: str, *, txid: int | None = None, limit: int = 100
) -> list[QuarantinedRow]:
    """The pipeline's quarantined rows (of ``txid`` only, if given), newest txid first."""
    query = select(QUARANTINE).where(QUARANTINE.c.pipeline == pipeline)
    if txid is not None:
        query = query.where(QUARANTINE.c.txid == txid)
    query = query.order_by(QUARANTINE.c.txid.desc(), QUARANTINE.c.id).limit(limit)
    return [
        QuarantinedRow(
            r.output, int(r.txid), int(r.attempt), tuple(r.expectations), r.row, r.quarantined_at
        )
        for r in conn.execute(query)
    ]


def quarantined_counts(conn: Connection, pipeline: str) -> dict[str, int]:
    """Quarantined rows per output of ``pipeline``."""
    query = (
        select(QUARANTINE.c.output, func.count())
        .where(QUARANTINE.c.pipeline == pipeline)
        .group_by(QUARANTINE.c.output)
    )
    return {str(o): int(n) for o, n in conn.execute(query)}


def stage_quarantined(
    conn: Connection, pipeline: str, txid: int, attempt: int, output: str, rows: pa.Table
) -> int:
    """Stage the rows a Spark job took out of ``output`` (``"input"`` or a lake sink) for
    ``(txid, attempt)``'s drops: ``rows`` has ``expectations`` (the names of those each fails)
    and ``row`` (JSON text). One statement; a run staging again replaces its own."""
    conn.execute(
        delete(QUARANTINE_STAGING).where(
            QUARANTINE_STAGING.c.pipeline == pipeline,
            QUARANTINE_STAGING.c.txid == txid,
            QUARANTINE_STAGING.c.attempt == attempt,
            QUARANTINE_STAGING.c.output == output,
        )
    )
    if not rows.num_rows:
        return 0
    staged = conn.execute(
        text(
            "INSERT INTO txn_quarantine_staging (pipeline, output, txid, attempt, expectations, "
            "row) SELECT :p, :o, :t, :a, e::text[], r::jsonb "
            "FROM unnest(CAST(:e AS text[]), CAST(:r AS text[])) AS u(e, r)"
        ),
        {
            "p": pipeline,
            "o": output,
            "t": txid,
            "a": attempt,
            "e": ["{" + ",".join(_quoted(n) for n in names) + "}" for names in _column(rows, 0)],
            "r": _column(rows, 1),
        },
    )
    return int(staged.rowcount)


def _column(rows: pa.Table, i: int) -> list[Any]:
    return list(rows.column(i).to_pylist())


def _quoted(name: str) -> str:  # an element of a Postgres array literal
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def publish_quarantined(
    conn: Connection,
    pipeline: str,
    txid: int,
    attempt: int,
    judged: Iterable[str],
    dropped: Iterable[str],
) -> dict[str, int]:
    """``(txid, attempt)`` commits, its ``judged`` outputs audited: their rows staged for the
    ``dropped`` ones (those its verdict dropped rows of) move to the quarantine, the rest of
    theirs go, and so do the txid's other attempts' (a filling output's stay for its fill).
    Returns how many rows moved, per output."""
    moved = conn.execute(
        text(
            "WITH gone AS (DELETE FROM txn_quarantine_staging WHERE pipeline = :p AND txid = :t "
            "AND (attempt <> :a OR output = ANY(:j)) RETURNING output, attempt, expectations, row) "
            "INSERT INTO txn_quarantine (pipeline, output, txid, attempt, expectations, row) "
            "SELECT :p, output, :t, attempt, expectations, row FROM gone "
            "WHERE attempt = :a AND output = ANY(:d) RETURNING output"
        ),
        {"p": pipeline, "t": txid, "a": attempt, "j": sorted(judged), "d": sorted(dropped)},
    ).scalars()
    return dict(Counter(moved))


def take_back_quarantined(conn: Connection, pipeline: str, from_txid: int) -> dict[str, int]:
    """A rewind to ``from_txid``: its txids and later ones are undone, and their quarantined rows
    with them (their replays quarantine again). Returns how many rows went, per output."""
    gone = conn.execute(
        delete(QUARANTINE)
        .where(QUARANTINE.c.pipeline == pipeline, QUARANTINE.c.txid >= from_txid)
        .returning(QUARANTINE.c.output)
    ).scalars()
    conn.execute(
        delete(QUARANTINE_STAGING).where(
            QUARANTINE_STAGING.c.pipeline == pipeline, QUARANTINE_STAGING.c.txid >= from_txid
        )
    )
    return dict(Counter(gone))


def attempt_outcomes(
    conn: Connection, pipeline: str, *, since_txid: int
) -> list[tuple[int, int, list[Mapping[str, Any]]]]:
    """The outcomes every attempt of the txids above ``since_txid`` recorded, oldest first:
    ``[(txid, attempt, outcomes), ...]``, attempts that recorded none left out. The Transactions
    page's listed txids: the current attempt's audit, and which attempts a ``fail`` stopped."""
    query = (
        select(ATTEMPTS.c.txid, ATTEMPTS.c.attempt, ATTEMPTS.c.expectations)
        .where(
            ATTEMPTS.c.pipeline == pipeline,
            ATTEMPTS.c.txid > since_txid,
            ATTEMPTS.c.expectations.is_not(None),
        )
        .order_by(ATTEMPTS.c.txid, ATTEMPTS.c.attempt)
    )
    return [(int(t), int(a), list(e)) for t, a, e in conn.execute(query)]


def quarantined_counts_of(conn: Connection, pipeline: str, txid: int) -> dict[str, int]:
    """Quarantined rows of one txid of ``pipeline``, per output."""
    query = (
        select(QUARANTINE.c.output, func.count())
        .where(QUARANTINE.c.pipeline == pipeline, QUARANTINE.c.txid == txid)
        .group_by(QUARANTINE.c.output)
    )
    return {str(o): int(n) for o, n in conn.execute(query)}


__all__ = [
    "QuarantinedRow",
    "attempt_outcomes",
    "committed_counts",
    "committed_outcomes",
    "publish_quarantined",
    "quarantined",
    "quarantined_counts",
    "quarantined_counts_of",
    "stage_quarantined",
    "take_back_quarantined",
]
