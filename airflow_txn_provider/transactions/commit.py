"""The commit protocol of a txid, in one place: from its processed output to its committed state.

A processing job stages its output fenced by its attempt and records it (the log's
``stage_output``, or :func:`record_processed` after several jobs). Its commit
(:func:`commit_registered`) is then ONE Postgres transaction under the pipeline's row lock,
strictly in txid order (:func:`~airflow_txn_provider.rules.coordinator.plan_commit`):

0. outputs complete from a later txid or filling from history are left out, and one never
   declared is refused past txid 1 (:mod:`airflow_txn_provider.log.outputs`);
1. the states' expectations are checked over their staged rows (:mod:`.audit`): a failed ``fail``
   expectation stops here, ``drop`` moves failing rows to the quarantine; derived states compute
   their batch from the committed values before this txid, and are checked next;
2. every state applies the attempt's staged rows by its kind's rule, their count checked;
3. every lake sink commits the recorded files in a table commit that records txid and attempt,
   never twice, after rewinding a table that holds another attempt's or undone txids' rows
   (:func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit`);
4. the log marks the txid committed, moves the last committed txid, prunes old txids' rows.

An error in 1-3 rolls it all back and fails the txid with the cascade. After it, each sink deletes
its staging leftovers (best effort), and :func:`commit_ready` commits what else may, in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.health import health_of
from airflow_txn_provider.log.outputs import read_outputs, record_complete_from_txid_1
from airflow_txn_provider.log.rows import TxidRows
from airflow_txn_provider.rules.coordinator import committable
from airflow_txn_provider.rules.exceptions import StagedOutputMismatchError, StateDefinitionError
from airflow_txn_provider.rules.outputs import FILLING, DeclaredOutput, skipped_at_commit
from airflow_txn_provider.rules.vocabulary import OutputKind
from airflow_txn_provider.sinks.base import OUTPUT_PREFIX, StagedFiles
from airflow_txn_provider.state import BucketCountState, MapState, counted_states, load_states
from airflow_txn_provider.transactions.apply import Outputs, SinkWrite, apply_txid, clean_up
from airflow_txn_provider.transactions.audit import (
    Audit,
    audit_measured,
    audit_states,
    send_metrics,
)
from airflow_txn_provider.transactions.rewind import read_rewound_through
from airflow_txn_provider.utils import metrics

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.rules.expectations import Expectation
    from airflow_txn_provider.rules.records import PipelineView, TxRecord
    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.transactions.pipeline_transitions import CommitResult
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)


def commit_states(
    txlog: TransactionLog,
    pipeline: str,
    txid: int,
    attempt: int,
    states: Sequence[MapState],
    sinks: Sequence[LakeSink] = (),
    expectations: Sequence[Expectation] = (),
) -> CommitResult:
    """Commit ``(txid, attempt)``: apply every state and mark the txid committed in ONE database
    transaction (the log's commit), checking each state's staged count against the recorded output.

    ``expectations`` on the states are audited first (:mod:`airflow_txn_provider.transactions.
    audit`): a failed ``fail`` expectation fails the txid instead, a poison batch.

    Lake sinks (:mod:`airflow_txn_provider.sinks`) commit last, inside that transaction: after
    their table commits only the log's own updates remain, and a commit retried after a crash
    there finds its txid in the table and adds nothing twice. Their staging leftovers are
    cleaned up once the log has committed.
    """
    for state in states:
        if state.pipeline != pipeline:
            raise StateDefinitionError(
                f"state {state.name!r} belongs to pipeline {state.pipeline!r}",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )

    by_name = {state.name: state for state in states}
    for state in states:
        if state.derived_from is not None and state.derived_from not in by_name:
            raise StateDefinitionError(
                f"state {state.name!r} is derived from {state.derived_from!r}, which this commit "
                f"does not apply (states: {sorted(by_name)})",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )
    declared = [DeclaredOutput(s.name, OutputKind.STATE, s.derived_from) for s in states]
    declared += [DeclaredOutput(s.name, OutputKind.LAKE_SINK) for s in sinks]
    log_url = txlog.engine.url.render_as_string(hide_password=False)
    outputs = Outputs.open(pipeline, states, sinks, log_url)
    writes: list[SinkWrite] = []
    audit = Audit()

    def apply(conn: Connection, record: TxRecord) -> dict[str, Any]:
        audit.outcomes.clear()  # a commit retried after a lost connection audits again
        audit.dropped.clear()
        recorded = dict(record.output or {})
        given = {sink.output_key for sink in sinks}
        unknown = sorted(k for k in recorded if k.startswith(OUTPUT_PREFIX) and k not in given)
        if unknown:  # committing without them would mark the txid committed, its files lost
            raise StateDefinitionError(
                f"the txid staged output for lake sink(s) {unknown} that this commit was not "
                "given (pass the pipeline's sinks)",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )
        # An output added to the running pipeline holds the txids from its first on, exactly:
        # an older txid committing now (in flight then, replayed, rewound) is not applied to it.
        skipped, first = skipped_at_commit(
            pipeline, txid, attempt, declared, read_outputs(conn, pipeline)
        )
        record_complete_from_txid_1(conn, pipeline, first)
        live = outputs.only({o.name for o in declared} - set(skipped))
        rows = {s.name: recorded.get(s.output_key) for s in live.states}
        audited = [e for e in expectations if e.on in {s.name for s in live.states}]
        # The audit before the rows are used: drops leave staging before a state derives from it.
        plain = [s for s in live.states if s.derived_from is None]
        audit_started = time.monotonic()
        # first what the job measured: the input batch's and the lake sinks' expectations
        sinks_on = [s.name for s in live.sinks]
        audit_measured(conn, pipeline, sinks_on, expectations, recorded, txid, attempt, audit=audit)
        audit_states(conn, plain, audited, txid, attempt, rows=rows, audit=audit)
        # Derived states read the committed values as they are before this txid: first.
        for state in states:
            if isinstance(state, BucketCountState) and state.name not in skipped:
                state.derive(conn, txid, attempt, by_name[state.of])
        derived = [s for s in live.states if s.derived_from is not None]
        audit_states(conn, derived, audited, txid, attempt, rows=rows, audit=audit)
        audit_seconds = time.monotonic() - audit_started  # the derive's time too, if any
        files = {s.name: recorded.get(s.output_key) for s in live.sinks}
        applied = apply_txid(
            conn,
            live,
            txid,
            attempt,
            rows={n: None if r is None else r - audit.dropped.get(n, 0) for n, r in rows.items()},
            files={name: StagedFiles.from_json(f) if f else None for name, f in files.items()},
            # which lake commits a rewind undid (a table still holding them follows the log now)
            rewound_through=read_rewound_through(conn, pipeline) if live.sinks else 0,
        )
        if audit.outcomes:
            TxidRows(conn, pipeline, txid).record_expectations(attempt, audit.records())
            TxidRows(conn, pipeline, txid).add_timings(attempt, {"audit": audit_seconds})
        # a skipped sink's staged files are garbage (a filling one's fill commits them)
        garbage = [s for s in sinks if skipped.get(s.name) not in (None, FILLING)]
        writes[:] = applied.writes + [SinkWrite(s, txid, None) for s in garbage]
        return {**{name: {"skipped": why} for name, why in skipped.items()}, **applied.details}

    started = time.monotonic()
    result = txlog.commit(pipeline, txid, attempt, apply)
    if result.applied:
        metrics.timing(metrics.COMMIT_DURATION, pipeline, time.monotonic() - started)
        metrics.gauge(metrics.LAST_COMMITTED, pipeline, txid)
        staged_rows = sum(
            int(d.get("staged_rows", 0))
            for d in (result.details or {}).values()
            if isinstance(d, dict) and "keys" in d
        )
        metrics.incr(metrics.STAGED_ROWS, pipeline, staged_rows)
        send_metrics(pipeline, audit)
        clean_up(pipeline, writes)
    return result


def commit_registered(
    txlog: TransactionLog,
    pipeline: str,
    txid: int,
    attempt: int,
    sinks: Sequence[LakeSink] = (),
    expectations: Sequence[Expectation] = (),
) -> CommitResult:
    """Commit ``(txid, attempt)`` applying every state registered for ``pipeline`` and committing
    into its lake ``sinks``, audited by ``expectations`` first."""
    states = list(load_states(txlog.engine, pipeline).values())
    return commit_states(txlog, pipeline, txid, attempt, states, sinks, expectations)


def record_processed(txlog: TransactionLog, pipeline: str, txid: int, attempt: int) -> str:
    """Mark ``(txid, attempt)`` processed with its staged row counts, under the txid's lock.

    The last step of a txid processed by several jobs (each staged with ``finish=False``, which
    records its counts in the attempt's logged row, :meth:`TransactionLog.stage`). The output
    recorded is the sum of the jobs' counts, and every state staged by jobs gets one, zero
    included, so the commit checks each. Staging tables are UNLOGGED: a Postgres crash recovery
    (a backend killed by the OOM killer) or a promoted standby empties them, with no clock to
    tell. So the rows present are compared with the counts the jobs recorded: if any are gone,
    the attempt is failed (and replays) with :class:`StagedOutputMismatchError` instead of
    recording what is left. Returns the
    :class:`~airflow_txn_provider.rules.vocabulary.ProcessedAction` value.
    """
    states = counted_states(txlog.engine, pipeline)

    def count(conn: Connection) -> dict[str, int]:
        recorded = dict.fromkeys(states, 0)
        for counts in TxidRows(conn, pipeline, txid).staged_by_job(attempt).values():
            for key, rows in counts.items():
                recorded[key] = recorded.get(key, 0) + int(rows)
        lost = {
            state.name: (recorded[state.output_key], present)
            for state in states.values()
            if (present := state.staged_count(conn, txid, attempt)) != recorded[state.output_key]
        }
        if lost:
            raise StagedOutputMismatchError(
                "staged rows (recorded by the jobs, found) differ: "
                + ", ".join(f"{name} {want} != {got}" for name, (want, got) in lost.items())
                + "; the staging tables are UNLOGGED and a Postgres crash recovery empties them: "
                "replay the txid",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )
        return recorded

    try:
        return txlog.stage_output(pipeline, txid, attempt, count).value
    except StagedOutputMismatchError as err:
        txlog.fail(pipeline, txid, attempt, error=str(err))
        raise


# -- after a commit, on Airflow's side ------------------------------------------------------------


def commit_ready(
    txlog: TransactionLog, txn_pipeline: TxnPipeline, logger: Any, view: PipelineView | None = None
) -> list[int]:
    """Commit, in order, the txids that may commit now (the oldest uncommitted, while it is
    processed): the gap between two commits is then a database round trip, not a trigger poll
    plus a task start. ``view``: the pipeline as the caller just read it (the first look).
    Never raises: each txid's own commit task commits it otherwise."""
    done: list[int] = []
    first = view
    for _ in range(txn_pipeline.window_bound):
        try:
            view = first if first is not None else txlog.view(txn_pipeline.name)
            first = None
            rec = committable(view)
            if rec is None:
                break
            commit_registered(
                txlog,
                txn_pipeline.name,
                rec.txid,
                rec.attempt,
                txn_pipeline.sinks,
                txn_pipeline.expectations,
            )
        except Exception as err:  # its own run commits it (or reports why it cannot)
            logger.warning("committing what is ready stopped: %s", err)
            break
        logger.info("txid %s attempt %s committed", rec.txid, rec.attempt)
        done.append(rec.txid)
    if view is not None:  # the lags as the last look at the pipeline saw them
        judged = health_of(view, last_commit_at=None, pending_since=None, now=datetime.now(UTC))
        metrics.gauge(metrics.LAG_PROCESSED, txn_pipeline.name, judged.lag_processed)
        metrics.gauge(metrics.LAG_BEGUN, txn_pipeline.name, judged.lag_begun)
    return done


__all__ = [
    "commit_ready",
    "commit_registered",
    "commit_states",
    "record_processed",
]
