"""What the Transactions page shows, computed from log records: pure functions, no I/O.

The reader (:mod:`airflow_txn_provider.ui.reader`) loads rows from the transaction log and the
state tables; everything derived from them (durations, status counts, lag, chart series, state
summaries, who may see which pipeline) is decided here, so each rule is tested with plain values
and the FastAPI app stays a thin layer of routes and templates.

Every payload is plain JSON (ISO timestamps, seconds as floats), the same dicts feed the server
side templates and the JSON endpoints the page polls.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.python import UTC, fromisoformat
from airflow_txn_provider.log.health import newest_processed
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks.base import OUTPUT_PREFIX
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.ui.audit import audit_summary
from airflow_txn_provider.utils.redaction import redact_optional

if TYPE_CHECKING:
    from airflow_txn_provider.log.reads import AttemptInfo, TransactionInfo

STATUSES: tuple[str, ...] = tuple(s.value for s in TxStatus)
"""Statuses in the order the page lists them."""
TXID_LIMIT = 200
"""How many of the newest txids the pipeline page lists (and charts)."""
TOP_KEYS = 10
METADATA_CHARS = 160
RATE_WINDOW_S = 300.0
"""The commit rate is averaged over the last five minutes."""


# -- access ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DagAccess:
    """Which pipelines a user may read, from Airflow's auth manager.

    A pipeline is visible if the user may read a DAG that runs it (``pipeline_dags``: the DAGs
    that run it now, :func:`~airflow_txn_provider.ui.reader.pipeline_dags`), not a DAG that
    merely has the pipeline's name: a DAG built with ``build_dag(pipeline, dag_id=…)`` has another
    id, and a DAG named like the pipeline may be unrelated. A pipeline no known DAG runs
    (registered by a script, its DAG never began a txid, or was deleted) is visible only to users
    who may read all DAGs: nobody else has a permission that covers it.
    """

    all_dags: bool = False
    dag_ids: frozenset[str] = field(default_factory=frozenset)
    pipeline_dags: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Pipeline name -> ids of the DAGs that run it now."""

    def may_read(self, pipeline: str) -> bool:
        return self.all_dags or not self.dag_ids.isdisjoint(self.pipeline_dags.get(pipeline, ()))

    def may_read_dag(self, dag_id: str) -> bool:
        """Whether the user may read this DAG itself (what its run page's tab asks first)."""
        return self.all_dags or dag_id in self.dag_ids

    def visible(self, pipelines: Iterable[str]) -> list[str]:
        return [name for name in pipelines if self.may_read(name)]


def pipelines_run_by(
    dag_id: str,
    pipeline_dags: Mapping[str, Iterable[str]],
    access: DagAccess,
    registered: Callable[[], Iterable[str]],
) -> list[str]:
    """The pipelines whose txids a run of ``dag_id`` shows, sorted: those the DAG runs now
    (``pipeline_dags``), whatever its name. If there is none (a DAG whose ``begin`` task has not
    run since the log learnt to record it), the pipeline named like the DAG, but only if it is
    ``registered``, ``access`` lets the user read it (the name alone proves nothing, so it may
    not open a pipeline the rules hide) and the log records no DAG for it either (one that does
    is run by those DAGs: this one merely shares its name). ``registered`` is read only then."""
    recorded = sorted(name for name, dag_ids in pipeline_dags.items() if dag_id in dag_ids)
    if recorded:
        return recorded
    namesake_unclaimed = not pipeline_dags.get(dag_id)
    if namesake_unclaimed and access.may_read(dag_id) and dag_id in set(registered()):
        return [dag_id]
    return []


# -- formatting ------------------------------------------------------------------------------------


def iso(when: datetime | None) -> str | None:
    """ISO 8601 in UTC (Postgres hands timestamps in the session's time zone)."""
    if when is None:
        return None
    return (when.astimezone(UTC) if when.tzinfo is not None else when).isoformat()


def clock(value: str | None, now: str | None = None) -> str:
    """``HH:MM:SS`` (UTC) of an ISO time, with the date in front unless it is ``now``'s day.

    The page's JavaScript has the same function (``fmtTime`` in ``static/txn.js``).
    """
    if not value:
        return "—"
    when = fromisoformat(value)
    when = when.astimezone(UTC) if when.tzinfo is not None else when
    today = fromisoformat(now).astimezone(UTC).date() if now else None
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    """``end - start`` in seconds, ``None`` if either is unknown (never negative: clock skew)."""
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def format_duration(seconds: float | None) -> str:
    """Short human text: ``0.35 s``, ``12.3 s``, ``4m 05s``, ``2h 03m``; ``—`` when unknown.

    The page's JavaScript has the same function (``fmtDuration`` in ``static/txn.js``).
    """
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def compact_json(value: Any, limit: int = METADATA_CHARS) -> str:
    """One-line JSON (sorted keys, no spaces), cut to ``limit`` characters with ``…``."""
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    """Indented JSON of a txid's metadata or output, for reading in full."""
    return json.dumps(value, sort_keys=True, indent=2, default=str)


def json_number(value: Any) -> Any:
    """A state value as JSON: ``Decimal`` becomes an int when integral, else a float."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def key_label(key: Sequence[Any]) -> str:
    """``("dog",)`` → ``dog``; ``("eu", 3)`` → ``eu, 3``."""
    return ", ".join(str(part) for part in key)


# -- pipelines -------------------------------------------------------------------------------------


def status_counts(last_committed: int, in_flight: Iterable[TxRecord]) -> dict[str, int]:
    """Txids per status. Commits happen in txid order, so txids 1..last_committed are exactly the
    committed ones and every other status lives among the txids in flight."""
    counts = dict.fromkeys(STATUSES, 0)
    counts[TxStatus.COMMITTED.value] = last_committed
    for rec in in_flight:
        counts[rec.status.value] += 1
    return counts


def pipeline_summary(view: PipelineView) -> dict[str, Any]:
    """One pipeline's line on the index (and header of its page).

    ``lag`` is the newest processed txid minus the newest committed one: how many txids finished
    processing and wait for their turn to commit (or for a failed txid before them to replay).
    """
    processed = newest_processed(view.last_committed, view.in_flight)
    newest = view.in_flight[-1].txid if view.in_flight else view.last_committed
    failed = [r for r in view.in_flight if r.status is TxStatus.FAILED]
    return {
        "name": view.pipeline,
        "source_kind": view.source_kind.value,
        "max_pending": view.max_pending,
        "last_committed": view.last_committed,
        "last_committed_run_id": txid_run_id(view.last_committed) if view.last_committed else None,
        "newest_txid": newest,
        "newest_processed": processed,
        "lag": processed - view.last_committed,
        "counts": status_counts(view.last_committed, view.in_flight),
        "oldest_failed": failed[0].txid if failed else None,
    }


def retention_summary(
    keep_txids: int,
    pruned_txids: int,
    pruned_attempts: int,
    pruned_failed_attempts: int,
    pruned_through_txid: int,
) -> dict[str, Any]:
    """What retention keeps and what it summarised: the newest ``keep_txids`` committed txids
    keep their record and attempts; older ones are only counted (all of them committed)."""
    text = f"newest {keep_txids} committed kept"
    if pruned_txids:
        text += (
            f" · txids 1..{pruned_through_txid} pruned: {pruned_txids} txids, "
            f"{pruned_attempts} attempts ({pruned_failed_attempts} failed)"
        )
    return {
        "keep_txids": keep_txids,
        "pruned_txids": pruned_txids,
        "pruned_attempts": pruned_attempts,
        "pruned_failed_attempts": pruned_failed_attempts,
        "pruned_through_txid": pruned_through_txid,
        "text": text,
    }


def broken_pipeline(name: str, error: str) -> dict[str, Any]:
    """Index line of a pipeline whose log could not be read (e.g. a corrupt log): say why."""
    return {"name": name, "error": error}


def window_since(newest_txid: int, limit: int = TXID_LIMIT) -> int:
    """``since_txid`` that lists the newest ``limit`` txids (``transactions`` is exclusive)."""
    return max(0, newest_txid - limit)


# -- txids and attempts ----------------------------------------------------------------------------


def _elapsed(
    start: datetime | None, end: datetime | None, running: bool, now: datetime
) -> tuple[float | None, bool]:
    """Duration of a phase: finished (``end`` known), still running (until ``now``), or unknown."""
    if end is not None:
        return seconds_between(start, end), False
    if running and start is not None:
        return seconds_between(start, now), True
    return None, False


def txid_row(tx: TransactionInfo, now: datetime) -> dict[str, Any]:
    """A txid's line: its current attempt with durations of processing and of the wait to commit.

    ``processing_s`` runs from begin to processed; ``commit_wait_s`` from processed to committed
    (the turn in txid order plus the commit itself). A phase still under way counts up to ``now``
    and says so (``*_running``).
    """
    status = tx.status
    processing_s, processing_running = _elapsed(
        tx.begun_at, tx.processed_at, status is TxStatus.PROCESSING, now
    )
    commit_wait_s, commit_wait_running = _elapsed(
        tx.processed_at, tx.committed_at, status is TxStatus.PROCESSED, now
    )
    return {
        "txid": tx.txid,
        "run_id": txid_run_id(tx.txid),
        "attempt": tx.attempt,
        "status": status.value,
        "metadata": tx.metadata,
        "metadata_json": compact_json(tx.metadata),
        "output": tx.output,
        "lake": lake_text(tx.output),
        "begun_at": iso(tx.begun_at),
        "processed_at": iso(tx.processed_at),
        "committed_at": iso(tx.committed_at),
        "processing_s": processing_s,
        "processing_running": processing_running,
        "commit_wait_s": commit_wait_s,
        "commit_wait_running": commit_wait_running,
        "last_error": redact_optional(tx.last_error),  # rows stored before redaction too
        "failed_by": tx.failed_by,
        "failed_by_earlier": failed_by_earlier(tx.txid, tx.failed_by),
    }


def lake_text(output: Mapping[str, Any] | None) -> str:
    """The lake tables a txid wrote (``lake:<sink>`` entries of its output): the table version
    it committed as (Delta's version, Iceberg's snapshot id), or its rows while only staged."""
    parts = []
    for key, value in sorted((output or {}).items()):
        if not key.startswith(OUTPUT_PREFIX) or not isinstance(value, Mapping):
            continue
        name, commit = key.removeprefix(OUTPUT_PREFIX), value.get("commit")
        if isinstance(commit, Mapping):
            version = commit.get("version")
            parts.append(f"{name} v{version}" if version is not None else f"{name}: no rows")
        else:
            parts.append(f"{name}: {value.get('rows', 0)} rows staged")
    return ", ".join(parts)


def failed_by_earlier(txid: int, failed_by: int | None) -> int | None:
    """The earlier txid whose failure failed this one, ``None`` if it failed on its own or a
    rewind failed it (``failed_by`` 0: its error says "rewound to txid N by …")."""
    return failed_by if failed_by and failed_by != txid else None


def txid_rows(txs: Iterable[TransactionInfo], now: datetime) -> list[dict[str, Any]]:
    """Rows newest first."""
    return [txid_row(tx, now) for tx in sorted(txs, key=lambda t: t.txid, reverse=True)]


def attempt_row(a: AttemptInfo, now: datetime) -> dict[str, Any]:
    """One attempt of a txid: its own processing time and, once it ended, its whole lifetime."""
    status = a.status
    processing_s, processing_running = _elapsed(
        a.started_at, a.processed_at, status is TxStatus.PROCESSING, now
    )
    return {
        "attempt": a.attempt,
        "status": status.value,
        "metadata": a.metadata,
        "metadata_json": compact_json(a.metadata),
        "output": a.output,
        "started_at": iso(a.started_at),
        "processed_at": iso(a.processed_at),
        "ended_at": iso(a.ended_at),
        "processing_s": processing_s,
        "processing_running": processing_running,
        "total_s": seconds_between(a.started_at, a.ended_at),
        "error": redact_optional(a.error),
        "failed_by": a.failed_by,
        "failed_by_earlier": failed_by_earlier(a.txid, a.failed_by),
        "timings": dict(a.timings),
        "timings_text": timings_text(a.timings),
        "audit": audit_summary(a.expectations),
    }


TIMING_PHASES = ("start", "connect", "spark", "staging", "commit")
"""An attempt's phases in the order they happen (``AttemptInfo.timings``): from its begin to its
job's start (task scheduling and start), the Spark Connect session, read + transform + collect,
the COPY into Postgres, the commit (its lock wait and apply)."""


def timings_text(timings: Mapping[str, float]) -> str:
    """``start 1.2 s · spark 3.4 s · …``: where an attempt's time went, phases in order, then any
    other reported (a job's own, with several jobs)."""
    known = [k for k in TIMING_PHASES if k in timings]
    others = sorted(k for k in timings if k not in TIMING_PHASES)
    return " · ".join(f"{k} {format_duration(float(timings[k]))}" for k in [*known, *others])


def attempt_rows(attempts: Iterable[AttemptInfo], now: datetime) -> list[dict[str, Any]]:
    """Attempts newest first (the current one on top)."""
    return [attempt_row(a, now) for a in sorted(attempts, key=lambda a: a.attempt, reverse=True)]


# -- chart -----------------------------------------------------------------------------------------


def _epoch(when: datetime) -> float:
    return round(when.timestamp(), 3)


def chart_series(txs: Sequence[TransactionInfo], now: datetime) -> dict[str, Any]:
    """Series for the chart, from the listed txids' current timestamps (points are ``[t, y]``,
    ``t`` in epoch seconds):

    * ``committed``: the newest committed txid over time (commits are in txid order, so this is
      also the cumulative number of commits); one point per commit.
    * ``processed``: the newest processed txid over time (a committed txid was processed too).
    * ``lag``: processed minus committed after each event: the step line under the chart.
    * ``per_minute``: commits per minute ``[minute start, count]``, minutes without commits left
      out; ``rate_per_min`` averages the last five minutes.

    Txids before the listed ones are committed, so the lines start at the oldest listed txid - 1.
    Times of earlier attempts are not drawn: each txid counts with its current attempt.
    """
    base = min((t.txid for t in txs), default=1) - 1
    events: list[tuple[datetime, int, int]] = []  # (time, 0 processed / 1 committed, txid)
    for t in txs:
        if t.processed_at is not None and t.status in (TxStatus.PROCESSED, TxStatus.COMMITTED):
            events.append((t.processed_at, 0, t.txid))
        if t.committed_at is not None and t.status is TxStatus.COMMITTED:
            events.append((t.committed_at, 1, t.txid))
    events.sort()
    newest = {0: base, 1: base}
    committed: list[list[float]] = []
    processed: list[list[float]] = []
    lag: list[list[float]] = []
    for when, kind, txid in events:
        if txid <= newest[kind]:
            continue  # an older txid's late timestamp: the newest one is unchanged
        newest[kind] = txid
        point = [_epoch(when), float(txid)]
        (committed if kind else processed).append(point)
        lag.append([_epoch(when), float(max(0, newest[0] - newest[1]))])
    minutes: dict[int, int] = {}
    recent = 0
    for t in txs:
        if t.committed_at is not None and t.status is TxStatus.COMMITTED:
            minute = int(t.committed_at.timestamp() // 60 * 60)
            minutes[minute] = minutes.get(minute, 0) + 1
            if 0 <= (now - t.committed_at).total_seconds() <= RATE_WINDOW_S:
                recent += 1
    return {
        "now": _epoch(now),
        "committed": committed,
        "processed": processed,
        "lag": lag,
        "per_minute": [[float(m), float(n)] for m, n in sorted(minutes.items())],
        "rate_per_min": round(recent / (RATE_WINDOW_S / 60), 2),
    }


# -- states ----------------------------------------------------------------------------------------


def global_state_summary(name: str, kind: str, value: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "type": "global", "value": json_number(value)}


def map_state_summary(
    name: str,
    kind: str,
    key_columns: Sequence[str],
    keys: int,
    total: Any,
    top: Iterable[Sequence[Any]],
) -> dict[str, Any]:
    """A map state in a few numbers: how many keys, the sum of the values, the top keys.

    :param top: rows ``(key values…, value)``, largest value first (the reader asks Postgres for
        them: a state may hold millions of keys, too many to load on every refresh).
    """
    return {
        "name": name,
        "kind": kind,
        "type": "map",
        "key_columns": list(key_columns),
        "keys": int(keys),
        "sum": json_number(total) if total is not None else 0,
        "top": [{"key": key_label(row[:-1]), "value": json_number(row[-1])} for row in top],
    }


def with_completeness(
    states: Iterable[Mapping[str, Any]], outputs: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each state's summary with the sentence saying from which txid it is complete (its
    output's, :func:`airflow_txn_provider.rules.outputs.completeness`), beside its figures: a state
    added to the running pipeline is short of every earlier txid, and must not look whole."""
    said = {o["name"]: o for o in outputs}
    return [
        {
            **s,
            "complete": said.get(s["name"], {}).get("complete"),
            "partial": said.get(s["name"], {}).get("partial"),
        }
        for s in states
    ]


def state_error(name: str, error: str) -> dict[str, Any]:
    """A state whose table could not be read: its name and why, instead of a broken page."""
    return {"name": name, "type": "error", "error": error}
