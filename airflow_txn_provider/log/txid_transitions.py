"""The log's transitions that lock one txid's row only: staging, processed output, leases.

A txid's processing stages its output, records it and keeps its lease alive while other txids do
the same in parallel, so these transitions lock the txid's own row, never the pipeline's. They
apply the attempt fence (:mod:`airflow_txn_provider.rules.fencing`): a stale attempt stages and
records nothing. A commit or failure of the txid waits for the row and sees the result. The failure
sensor's answer to a failed attempt is recorded here too, on that attempt's row.
:class:`TxidTransitions` is a part of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import TxidRows
from airflow_txn_provider.rules.fencing import (
    attempt_is_current,
    attempt_may_stage,
    lease_renewal,
    plan_processed,
)
from airflow_txn_provider.rules.vocabulary import (
    FailureResponse,
    LeaseRenewal,
    ProcessedAction,
    TxStatus,
)
from airflow_txn_provider.utils.retries import retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)

StageFn = Callable[["Connection"], "Mapping[str, Any] | None"]


class TxidTransitions(LogPart):
    """The transitions under one txid's row lock."""

    # -- processed -------------------------------------------------------------------------------

    def mark_processed(
        self, pipeline: str, txid: int, attempt: int, output: Mapping[str, Any] | None = None
    ) -> ProcessedAction:
        """Record that ``(txid, attempt)`` finished processing, with a reference to its output.

        A report from an attempt that is no longer current is ignored (``IGNORE_STALE``); a repeat
        of the same report is a no-op (``DUPLICATE``).
        """
        return self.stage_output(pipeline, txid, attempt, lambda conn: output)

    @retry_transient
    def stage(
        self,
        pipeline: str,
        txid: int,
        attempt: int,
        stage: StageFn,
        *,
        job: str = "",
        timings: Mapping[str, float] | None = None,
    ) -> bool:
        """Run ``stage(conn)`` only while ``(txid, attempt)`` is current and still processing.

        For a txid with several processing jobs: each stages its part fenced by the attempt, and
        the last step records the processed output
        (:func:`~airflow_txn_provider.transactions.commit.record_processed`). ``stage`` returns
        what it staged, ``{output key: rows}``; it is recorded as ``job``'s in the attempt's logged
        row, in the same database transaction as the COPY, so staging lost later (the tables are
        UNLOGGED) is found by its content. Returns False (and stages nothing) for a stale attempt.
        """
        with self.engine.begin() as conn:
            found = TxidRows(conn, pipeline, txid)
            record = found.locked_record()
            if attempt_may_stage(
                record, pipeline=pipeline, txid=txid, attempt=attempt, pruned=found.pruned
            ):
                counts = stage(conn)
                if not isinstance(counts, Mapping):
                    raise TypeError(
                        f"stage() must return what it staged as {{output key: rows}}, got "
                        f"{counts!r}"
                    )
                rows = TxidRows(conn, pipeline, txid)
                rows.record_staged(
                    attempt, job, {k: v for k, v in counts.items() if isinstance(v, int)}
                )
                if timings:
                    rows.add_timings(attempt, timings)
                return True
        log.warning(
            "pipeline=%s txid=%s attempt=%s staged nothing: attempt is stale or already processed",
            pipeline,
            txid,
            attempt,
        )
        return False

    @retry_transient
    def stage_output(
        self,
        pipeline: str,
        txid: int,
        attempt: int,
        stage: StageFn,
        *,
        timings: Mapping[str, float] | None = None,
    ) -> ProcessedAction:
        """Stage ``(txid, attempt)``'s output and mark it processed, in one database transaction.

        ``stage(conn)`` writes the output (e.g. :meth:`MapState.stage`) and returns a reference to
        it, such as row counts. It runs only while the attempt is current, holding the txid's row
        lock, so a duplicate run of the same attempt replaces rather than doubles the staged rows
        and an attempt that was failed meanwhile stages nothing. ``timings`` (seconds per phase;
        ``stage`` may still add to it) are recorded on the attempt.
        """
        output_dict: dict[str, Any] | None = None
        with self.engine.begin() as conn:
            found = TxidRows(conn, pipeline, txid)
            record = found.locked_record()
            pruned = found.pruned
            if attempt_is_current(
                record, pipeline=pipeline, txid=txid, attempt=attempt, pruned=pruned
            ):
                output = stage(conn)
                output_dict = None if output is None else dict(output)
            action = plan_processed(
                record,
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
                output=output_dict,
                pruned=pruned,
            )
            if action is ProcessedAction.ACCEPT:
                rows = TxidRows(conn, pipeline, txid)
                rows.move(attempt, TxStatus.PROCESSED, output=output_dict)
                if timings:
                    rows.add_timings(attempt, timings)
        if action is ProcessedAction.IGNORE_STALE:
            log.warning(
                "pipeline=%s txid=%s attempt=%s processed report ignored: attempt is stale",
                pipeline,
                txid,
                attempt,
            )
        else:
            log.info(
                "pipeline=%s txid=%s attempt=%s processed (%s)",
                pipeline,
                txid,
                attempt,
                action.value,
            )
        return action

    # -- liveness --------------------------------------------------------------------------------

    @retry_transient
    def renew_lease(
        self, pipeline: str, txid: int, attempt: int, *, holder: str, timeout: float
    ) -> LeaseRenewal:
        """Prove that ``(txid, attempt)``'s process is alive for ``timeout`` more seconds.

        ``RENEWED`` while it processes; ``DONE`` once its output is recorded (nothing left to
        renew); ``LOST`` once it is failed or replaced (its process should stop: nothing it stages
        will count). Locks the txid's row only, never the pipeline.
        """
        with self.engine.begin() as conn:
            record = TxidRows(conn, pipeline, txid).locked_record()
            found = lease_renewal(record, attempt)
            if found is LeaseRenewal.RENEWED:
                TxidRows(conn, pipeline, txid).renew_lease(holder, timeout)
        return found

    # -- failure ---------------------------------------------------------------------------------

    @retry_transient
    def record_response(
        self, pipeline: str, txid: int, attempt: int, response: FailureResponse
    ) -> None:
        """Record what the failure sensor decided about failed ``(txid, attempt)``, so a retry of
        the sensor neither acts twice nor counts the txid's own failures again."""
        with self.engine.begin() as conn:
            TxidRows(conn, pipeline, txid).record_response(attempt, response)
