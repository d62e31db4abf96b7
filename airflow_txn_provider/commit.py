"""The commit protocol of a txid, in one place: from its processed output to its committed state.

A txid's processing job stages its output fenced by its attempt (state rows in Postgres staging
tables, :mod:`airflow_txn_provider.state`; lake files beside their table,
:mod:`airflow_txn_provider.sinks`) and records it: the log's
:meth:`~airflow_txn_provider.transaction_log.TransactionLog.stage_output`, or
:func:`record_processed` after several jobs. Then its commit (:func:`commit_registered`), strictly
in txid order, is ONE Postgres transaction holding the pipeline's row lock
(:meth:`~airflow_txn_provider.transaction_log.TransactionLog.commit`, which refuses a stale
attempt, an unprocessed txid or a commit out of order: the rule is
:func:`~airflow_txn_provider.coordinator.plan_commit`):

1. derived states compute their batch from the committed values before this txid
   (:meth:`~airflow_txn_provider.state.BucketCountState.derive`);
2. every state applies the attempt's staged rows by its kind's rule, and its staged row count
   must equal the recorded one (an UNLOGGED staging table lost in a crash fails the commit instead
   of committing part of a batch);
3. every lake sink commits the attempt's recorded files into its table, recording the txid and
   attempt in the table's own commit (:func:`~airflow_txn_provider.coordinator.plan_sink_commit`:
   a table that holds this attempt of the txid already is not written twice; one that holds
   another attempt's, from a commit that failed after its table commit, is rewound to the txid
   before and then written, so every table holds the committed attempt's rows only);
4. the log marks the txid committed and moves the pipeline's last committed txid (and prunes old
   txids' rows, by the retention rule).

Any error in 1-3 rolls all of it back and fails the txid with the cascade: it replays whole. After
the Postgres transaction, each sink deletes the txid's staging leftovers (best effort).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.exceptions import StagedOutputMismatchError, StateDefinitionError
from airflow_txn_provider.log_rows import TxidRows
from airflow_txn_provider.sinks.base import OUTPUT_PREFIX, StagedFiles
from airflow_txn_provider.state import BucketCountState, MapState, load_states

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.pipeline_transitions import CommitResult
    from airflow_txn_provider.records import TxRecord
    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.transaction_log import TransactionLog

log = logging.getLogger(__name__)


def commit_states(
    txlog: TransactionLog,
    pipeline: str,
    txid: int,
    attempt: int,
    states: Sequence[MapState],
    sinks: Sequence[LakeSink] = (),
) -> CommitResult:
    """Commit ``(txid, attempt)``: apply every state and mark the txid committed in ONE database
    transaction (the log's commit), checking each state's staged count against the recorded output.

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
    log_url = txlog.engine.url.render_as_string(hide_password=False)
    tables = {sink: sink.open(log_url) for sink in sinks}
    staged: dict[LakeSink, StagedFiles | None] = {}

    def apply(conn: Connection, record: TxRecord) -> dict[str, Any]:
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
        result: dict[str, Any] = {}
        # Derived states read the committed values as they are before this txid: first.
        for state in states:
            if isinstance(state, BucketCountState):
                state.derive(conn, txid, attempt, by_name[state.of])
        for state in states:
            expected = recorded.get(state.output_key)
            applied = state.apply(conn, txid, attempt, expected_rows=expected)
            result[state.name] = {"staged_rows": applied.staged_rows, "keys": applied.keys}
        patch = {}
        for sink in sinks:
            files = recorded.get(sink.output_key)
            staged[sink] = StagedFiles.from_json(files) if files else None
            done = sink.commit(tables[sink], pipeline, txid, attempt, staged[sink])
            result[sink.output_key] = done.to_json()
            patch[sink.output_key] = {**(files or {}), "commit": done.to_json()}
        if patch:
            TxidRows(conn, pipeline, txid).patch_output(attempt, patch)
        return result

    result = txlog.commit(pipeline, txid, attempt, apply)
    if result.applied:
        for sink, files in staged.items():
            # The table holds this attempt's files, whatever its action was (a table that held
            # another attempt's was rewound first): every other directory of the txid goes.
            try:
                sink.cleanup(pipeline, txid, files)
            except Exception as err:  # garbage left behind is not data lost: never fail a commit
                log.warning(
                    "pipeline=%s txid=%s sink=%s cleanup: %s", pipeline, txid, sink.name, err
                )
    return result


def commit_registered(
    txlog: TransactionLog,
    pipeline: str,
    txid: int,
    attempt: int,
    sinks: Sequence[LakeSink] = (),
) -> CommitResult:
    """Commit ``(txid, attempt)`` applying every state registered for ``pipeline`` and committing
    into its lake ``sinks``."""
    states = list(load_states(txlog.engine, pipeline).values())
    return commit_states(txlog, pipeline, txid, attempt, states, sinks)


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
    :class:`~airflow_txn_provider.vocabulary.ProcessedAction` value.
    """
    states = [s for s in load_states(txlog.engine, pipeline).values() if s.derived_from is None]

    def count(conn: Connection) -> dict[str, int]:
        recorded: dict[str, int] = {state.output_key: 0 for state in states}
        for counts in TxidRows(conn, pipeline, txid).staged_by_job(attempt).values():
            for key, rows in counts.items():
                recorded[key] = recorded.get(key, 0) + int(rows)
        lost = {
            state.name: (recorded[state.output_key], present)
            for state in states
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


__all__ = ["commit_registered", "commit_states", "record_processed"]
