"""The failure sensor of a txid's run: replays the txid when it fails, stops at a poison batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.bases.sensor import BaseSensorOperator

from airflow_txn_provider.compat.airflow import AirflowSkipException
from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.log.alerts import due_alerts, poisoned_alert, send_once
from airflow_txn_provider.rules.exceptions import PoisonBatchError, RequeueError
from airflow_txn_provider.rules.vocabulary import EventState, FailureResponse, TxStatus
from airflow_txn_provider.rules.waiting import (
    TxnEvent,
    first_watched_attempt,
    known_failed_attempt,
    own_failures,
    requeue_set,
    respond_to_failure,
)
from airflow_txn_provider.run_context import (
    BEGIN_TASK_ID,
    is_scheduled_txid_run,
    last_error,
    pipeline_log,
    run_txid,
    start_in_triggerer,
)
from airflow_txn_provider.timetables import txid_logical_date, txid_run_id
from airflow_txn_provider.triggers.txn_log import FIRST_WATCHED, RUN_TXID, TxnLogTrigger, WaitFor
from airflow_txn_provider.utils import metrics
from airflow_txn_provider.utils.lineage import lineage_enabled
from airflow_txn_provider.utils.redaction import redact

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

SETTLE_TIMEOUT = 120.0
"""Seconds a re-queue waits for the failed runs' tasks to stop before it clears them anyway."""
BUSY_STATES = frozenset(
    {
        "running",
        "queued",
        "scheduled",
        "restarting",
        "up_for_retry",
        "up_for_reschedule",
        "deferred",
    }
)
"""Task-instance states in which Airflow's scheduler or triggerer may be updating the task."""
REQUEUE_TIMEOUT = 60.0
"""Seconds a failed txid that could replay waits for its run to be restarted by the cascade's
origin before its own failure sensor restarts it (the origin's request was lost)."""


class TxnFailureSensor(BaseSensorOperator):
    """The failure sensor of one txid's run: restart the run when its txid fails, stop when it is
    a poison batch.

    Deferred from the claim to the end of the run (no worker slot), it wakes when the txid
    commits (the task ends in the triggerer: *skipped* if it had no failure to answer, which
    spares the dag-processor the parse Airflow makes for a task that succeeds there) or when an
    attempt of it fails. A failure of txid k fails k and every later txid in flight in the log
    (one database transaction); the sensor of each of those runs then restarts its run through
    the Airflow REST API, so they re-begin with new attempts, in order, after k. A txid that
    failed on its own ``max_attempts`` times stops the pipeline (a poison batch): its failed
    task stays red, the run's note and this task's log
    name the txid and its error, and later txids wait for it until a person fixes the cause and
    clears its run in the UI (which gives it a fresh ``max_attempts``). The log, not this task,
    keeps the count and what was done about each failure, so an Airflow retry of this task
    neither replays a poison batch once more nor restarts a run twice.

    It starts in the triggerer (``start_from_trigger``): a txid that commits without failing
    never starts it on a worker. Once a failure woke it on a worker, with OpenLineage on, it ends
    on a worker too (its lineage run gets its COMPLETE). Only scheduled txid runs are watched: a
    manual run (``dag.test``) has nobody to restart it.
    """

    ui_color = "#fde8e8"

    def __init__(
        self,
        *,
        txn_pipeline: TxnPipeline,
        claim_task_id: str = BEGIN_TASK_ID,
        triggerer_start: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.txn_pipeline = txn_pipeline
        self.claim_task_id = claim_task_id
        start_in_triggerer(
            self,
            self._trigger(RUN_TXID, FIRST_WATCHED, quiet=True),
            "on_failure",
            enabled=triggerer_start,
        )

    def txlog(self) -> TransactionLog:
        return pipeline_log(self.txn_pipeline)

    def poke(self, context: Context) -> bool:
        """Whether the run's txid committed (the watch's end)."""
        return self.txlog().view(self.txn_pipeline.name).last_committed >= run_txid(
            context, self.txn_pipeline.name
        )

    def execute(self, context: Context) -> None:
        txid = run_txid(context, self.txn_pipeline.name)
        if not is_scheduled_txid_run(context):
            raise AirflowSkipException("a manual run is not restarted on failure")
        view = self.txlog().view(self.txn_pipeline.name)
        self._watch(txid, first_watched_attempt(view, txid), quiet=True)

    def _watch(
        self, txid: int, attempt: int, *, requeue: bool = False, quiet: bool = False
    ) -> NoReturn:
        """Defer until the txid commits, an attempt after ``attempt`` fails, or its lease runs
        out; with ``requeue``, also if failed ``attempt`` waits too long for its run to restart.

        Called on a worker, where the OpenLineage listener (if a transport is set) sent this
        try's START: the try must then end on a worker too, whose listener sends COMPLETE (one
        in the triggerer sends no event, and the run would stay open in a lineage catalog).
        Without a transport it ends in the triggerer: no worker start at the commit; ``quiet``
        (no failure answered yet), as *skipped*: nothing to answer, and a task that succeeds in
        the triggerer costs a parse of its DAG file in the dag-processor."""
        trigger = self._trigger(
            txid, attempt, requeue=requeue, end_task_on_commit=not lineage_enabled(), quiet=quiet
        )
        self.defer(trigger=trigger, method_name="on_failure")

    def _trigger(
        self,
        txid: int,
        attempt: int,
        *,
        requeue: bool = False,
        end_task_on_commit: bool = True,
        quiet: bool = False,
    ) -> TxnLogTrigger:
        p = self.txn_pipeline
        return TxnLogTrigger(
            txn_log_conn_id=p.txn_log_conn_id,
            pipeline=p.name,
            txid=txid,
            attempt=attempt,
            wait_for=WaitFor.OUTCOME,
            poll_interval=p.poll_interval,
            end_task_on_commit=end_task_on_commit,
            requeue_timeout=REQUEUE_TIMEOUT if requeue else None,
            stall_alert_after=p.stall_alert_after if p.alert_notifiers else None,
            end_skipped=quiet,
        )

    def on_failure(self, context: Context, event: dict[str, Any], **_legacy: Any) -> None:
        """Answer a failed attempt of the run's txid (``_legacy``: a deferral made by an older
        version of this sensor carried ``own_failures``; the log counts them now)."""
        p = self.txn_pipeline
        woke = TxnEvent.from_payload(event, pipeline=p.name)
        if woke.state is EventState.MANUAL_RUN:  # started in the triggerer: it knows no txid
            raise AirflowSkipException("a manual run is not restarted on failure")
        txid = run_txid(context, p.name)
        if woke.state is EventState.COMMITTED:
            return
        txlog = self.txlog()
        if woke.state is EventState.ALERT:
            assert woke.attempt is not None  # from_payload requires it
            self._send_due_alerts(context, txlog)
            self._watch(txid, woke.attempt, requeue=self._awaits_requeue(txlog, txid, woke.attempt))
        if woke.state is EventState.LEASE_EXPIRED:
            # The trigger saw the lease run out; the log decides under its lock (a renewal that
            # came meanwhile wins) and fails the attempt and every later txid in flight.
            assert woke.attempt is not None  # from_payload requires it
            if p.alert_notifiers:
                # a lease long past with nobody to expire it (this sensor was ended by hand and
                # restarted by the waker) is a stall: alerted once, before the expiry mends it
                self._send_due_alerts(context, txlog)
            txlog.expire_lease(p.name, txid, woke.attempt)
        view = txlog.view(p.name)
        rec = view.record(txid)
        history = txlog.history(p.name, txid)
        if rec is None or rec.status is not TxStatus.FAILED or history[-1].attempt != rec.attempt:
            # alive, or re-begun meanwhile
            self._watch(txid, known_failed_attempt(txlog.view(p.name), txid))
        if woke.state is EventState.NOT_REQUEUED:
            self.log.warning(
                "pipeline=%s txid=%s attempt=%s could replay but its run was not restarted for "
                "%.0f s (the re-queue of its cascade was lost): restarting it",
                p.name,
                txid,
                rec.attempt,
                REQUEUE_TIMEOUT,
            )
            self._restart_runs(context, [txid], rec.attempt, rec.failed_by)
            self._watch(txid, rec.attempt, requeue=True)
        response = respond_to_failure(history, p.max_attempts)
        if history[-1].response is not None:
            # An earlier try of this sensor answered this failure, then was lost (a triggerer or
            # supervisor crash) and retried by Airflow: do not act or count twice. A re-queue
            # that never reached Airflow is noticed by the requeue timeout.
            self.log.info(
                "pipeline=%s txid=%s attempt=%s: its failure was answered already (%s)",
                p.name,
                txid,
                rec.attempt,
                response,
            )
            self._watch(txid, rec.attempt, requeue=response is not FailureResponse.STOP)
        own = own_failures(history)
        if response is FailureResponse.STOP:
            self._stop(context, txid, rec.attempt, own)
        if response is FailureResponse.LEAVE_TO_ORIGIN:
            self.log.info(
                "pipeline=%s txid=%s attempt=%s failed with txid %s, whose failure sensor "
                "re-queues this run",
                p.name,
                txid,
                rec.attempt,
                rec.failed_by,
            )
            txlog.record_response(p.name, txid, rec.attempt, response)
            self._watch(txid, rec.attempt, requeue=True)
        self.log.warning(
            "pipeline=%s txid=%s attempt=%s failed (%s of %s); re-queued txids %s",
            p.name,
            txid,
            rec.attempt,
            own,
            p.max_attempts,
            list(requeue_set(view, txid)),
        )
        cascade = [t for t in requeue_set(view, txid) if t >= txid] or [txid]
        self._restart_runs(context, cascade, rec.attempt, txid)
        # Recorded once the restart was requested: a retry after a crash in between restarts
        # again (harmless: the runs wait in their claims); one before it restarts at once.
        txlog.record_response(p.name, txid, rec.attempt, response)
        self._watch(txid, rec.attempt, requeue=True)

    def _stop(self, context: Context, txid: int, attempt: int, own: int) -> NoReturn:
        """Poison batch: say so where people look, then keep watching without restarting.

        The run stays running (this task deferred) on purpose: it keeps its ``max_active_runs``
        slot, so a Clear of this run in the UI can start it again while the later runs wait in
        theirs. A failed run would give its slot to a new, later run and the Clear would queue
        behind the runs waiting for it. The stop is recorded in the log last: a person's rerun
        after it starts a new count of the txid's own failures.
        """
        p = self.txn_pipeline
        txlog = self.txlog()
        last = last_error(txlog, p.name, txid)
        why = (
            "a fail expectation failed, a replay would stage the same rows"
            if txlog.history(p.name, txid)[-1].failed_expectation
            else f"failed {own} times on its own (max_attempts={p.max_attempts})"
        )
        error = PoisonBatchError(
            f"POISON BATCH, pipeline stopped: {why}, last error: {last}. Later txids wait for "
            "it. Fix the cause, then Clear this run in the Airflow UI",
            pipeline=p.name,
            txid=txid,
            attempt=attempt,
        )
        self.log.error("%s", error)
        self._api().set_run_note(context["dag"].dag_id, context["dag_run"].run_id, redact(error))
        # The later txids failed with it: restart their runs now (one request), so their begins
        # wait for this txid and follow it at once when a person reruns it.
        later = [t for t in requeue_set(txlog.view(p.name), txid) if t > txid]
        if later:
            self._restart_runs(context, later, attempt, txid)
        txlog.record_response(p.name, txid, attempt, FailureResponse.STOP)
        metrics.incr(metrics.POISONED, p.name)
        self._send(context, txlog, [poisoned_alert(p.name, txid, attempt, last)])
        self._watch(txid, attempt)

    def _send_due_alerts(self, context: Context, txlog: TransactionLog) -> None:
        """The trigger found alerts due: send what is still due (another sender may have)."""
        p = self.txn_pipeline
        view = txlog.view(p.name)
        with txlog.engine.connect() as conn:
            due = due_alerts(conn, view, p.stall_alert_after)
        self._send(context, txlog, due)

    def _send(self, context: Context, txlog: TransactionLog, alerts: Sequence[Any]) -> None:
        """Send each alert once; one that fails is logged and left unsent, for the trigger of
        the oldest txid's watch to find again (a broken notifier never stops the pipeline)."""
        for alert in alerts:
            try:
                send_once(txlog.engine, alert, self.txn_pipeline.alert_notifiers, context)
            except Exception:
                self.log.exception(
                    "pipeline=%s: the %s alert (%s) could not be sent; it is tried again later",
                    alert.pipeline,
                    alert.kind,
                    alert.key,
                )

    def _awaits_requeue(self, txlog: TransactionLog, txid: int, attempt: int) -> bool:
        """Whether the watch of ``attempt`` restarts its run if nobody does (as after answering
        its failure): it failed and was answered by a re-queue, not by a poison batch's stop."""
        last = txlog.history(self.txn_pipeline.name, txid)[-1:]
        return bool(
            last
            and last[0].attempt == attempt
            and last[0].status is TxStatus.FAILED
            and last[0].response not in (None, FailureResponse.STOP)
        )

    def _api(self) -> Any:
        return AirflowApiHook(self.txn_pipeline.airflow_api_conn_id)

    def _restart_runs(
        self, context: Context, txids: Sequence[int], attempt: int, failed_by: int | None
    ) -> None:
        """Restart the work of the runs of ``txids`` (consecutive) in one REST request, as a
        person's Clear would, for failed ``attempt`` of this run's txid. The failure sensors are
        not cleared: each keeps watching its txid.

        First it waits (up to ``SETTLE_TIMEOUT``) until those runs' tasks have settled: a commit
        gate whose attempt went stale is failing, a processing task whose lease was lost is
        stopping. Clearing a task instance while the scheduler or the triggerer is updating it
        makes theirs fail with ``StaleDataError``, which kills that Airflow component. Runs
        beyond them are not touched: their begins wait, and go on by themselves.
        """
        dag = context["dag"]
        origin = failed_by or txids[0]
        work = [t for t in dag.task_ids if t != self.task_id]
        self._wait_until_settled(dag.dag_id, [txid_run_id(t) for t in txids], work)
        own = (
            self.txlog()
            .view(self.txn_pipeline.name)
            .record(run_txid(context, self.txn_pipeline.name))
        )
        if own is None or own.status is not TxStatus.FAILED or own.attempt != attempt:
            # Restarted while its tasks settled (a person's Clear, or the re-queue this sensor
            # waited for arrived late): a second clear would add an attempt nobody asked for.
            self.log.info(
                "pipeline=%s: not restarting the runs of txids %s: attempt %s was replaced "
                "meanwhile (%s)",
                self.txn_pipeline.name,
                list(txids),
                attempt,
                own,
            )
            return
        cause = "its own failure" if origin in txids[:1] else f"txid {origin}'s failure"
        which = f"txid {txids[0]}" if len(txids) == 1 else f"txids {txids[0]}..{txids[-1]}"
        try:
            cleared = self._api().clear_task_instances(
                dag.dag_id,
                work,
                logical_dates=(txid_logical_date(txids[0]), txid_logical_date(txids[-1])),
                note=f"txid {origin}: attempt {attempt} failed ({cause}); re-queued {which}",
            )
        except RequeueError as err:
            raise RequeueError(
                f"could not restart the runs of {which}: {err.detail}",
                pipeline=self.txn_pipeline.name,
                txid=txids[0],
                attempt=attempt,
            ) from None
        self.log.info("restarted the runs of %s: cleared %s", which, cleared)

    def _busy(self, task_id: str, state: str | None) -> bool:
        """Whether Airflow may be updating the task now. A claim of a failed txid that waits,
        deferred, is quiet: it may claim only after the txid before it, failed too, is claimed
        again, which takes this very clear."""
        if task_id == BEGIN_TASK_ID or (task_id == self.claim_task_id and state == "deferred"):
            return False
        return state in BUSY_STATES

    def _wait_until_settled(
        self, dag_id: str, run_ids: Sequence[str], tasks: Sequence[str]
    ) -> None:
        api = self._api()
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            busy = [
                f"{run_id}.{ti['task_id']} ({ti['state']})"
                for run_id in run_ids
                for ti in api.task_instances(dag_id, run_id)
                if ti["task_id"] in tasks and self._busy(ti["task_id"], ti["state"])
            ]
            if not busy:
                return
            if time.monotonic() > deadline:
                self.log.warning("restarting runs although still busy: %s", ", ".join(busy))
                return
            self.log.info("waiting for the failed runs' tasks to settle: %s", ", ".join(busy))
            time.sleep(1.0)
