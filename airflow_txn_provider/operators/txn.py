"""The tasks of one txid's DAG run: thin over the transaction log and its rules.

``begin`` → ``process_<job>`` (one per job, in parallel) → [``processed``] → ``commit_gate`` →
``commit``; beside them ``watch_failures``. Every decision is the log's (and so the coordinator's):
these operators only claim, wait (deferred: no worker slot), run, and report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_txn_provider.coordinator import BeginAction, GateState, TxStatus
from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.timetables import txid_from_run_id, txid_run_id
from airflow_txn_provider.transaction_log import CLAIM_TIMEOUT
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transaction_log import TransactionLog

BEGIN_TASK_ID = "begin"
WATCH_TASK_ID = "watch_failures"
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
INJECT_FAILURE_VARIABLE = "txn_inject_failure__{pipeline}"
"""Airflow Variable of the failure-injection switch (see :func:`parse_failure_injection`)."""


def run_txid(context: Context, pipeline: str) -> int:
    """The txid of the running DAG run: from its run id ``txid-000042`` (the runs the timetable
    schedules), or from ``{"txid": 42}`` in the conf of a manual run (``dag.test``, debugging)."""
    dag_run = context["dag_run"]
    txid = txid_from_run_id(dag_run.run_id)
    if txid is not None:
        return txid
    conf_txid = (getattr(dag_run, "conf", None) or {}).get("txid")
    if isinstance(conf_txid, int) and not isinstance(conf_txid, bool) and conf_txid >= 1:
        return conf_txid
    raise AirflowFailException(
        f"pipeline={pipeline}: run {dag_run.run_id!r} is not a transaction (run ids are "
        "txid-000042): transactions start by themselves once the DAG is unpaused; to run one txid "
        'by hand (dag.test, debugging) pass the conf {"txid": 42}'
    )


def is_scheduled_txid_run(context: Context) -> bool:
    return txid_from_run_id(context["dag_run"].run_id) is not None


@dataclass(frozen=True)
class InjectedFailureRule:
    attempts: int | None
    """Attempts to fail (the first N), or ``None`` for every attempt."""
    delay: float = 0.0
    """Seconds to wait before failing, as a job that fails late does."""


def parse_failure_injection(spec: str) -> dict[int, InjectedFailureRule]:
    """Parse the failure-injection switch: ``"3"`` fails txid 3's first attempt, ``"3:2"`` its
    first two, ``"3:*"`` every attempt (a poison batch), ``"3@8"`` fails it after 8 seconds (the
    later txids are in flight by then, and fail with it); several are comma-separated
    (``"3@8,7:*"``)."""
    found: dict[int, InjectedFailureRule] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        rule, _, delay_text = part.partition("@")
        txid_text, _, attempts_text = rule.partition(":")
        try:
            txid = int(txid_text)
            attempts = None if attempts_text.strip() == "*" else int(attempts_text or 1)
            delay = float(delay_text or 0)
        except ValueError:
            raise ValueError(
                f"failure injection {spec!r}: {part!r} is not TXID[:N|:*][@SECONDS]"
            ) from None
        if txid < 1 or (attempts is not None and attempts < 1) or delay < 0:
            raise ValueError(
                f"failure injection {spec!r}: txid and attempts must be >= 1, seconds >= 0"
            )
        found[txid] = InjectedFailureRule(attempts, delay)
    return found


def injected_failure(spec: str | None, txid: int, attempt: int) -> InjectedFailureRule | None:
    """The rule asking ``(txid, attempt)`` to fail, if the switch has one."""
    if not spec:
        return None
    rule = parse_failure_injection(spec).get(txid)
    if rule is None or (rule.attempts is not None and attempt > rule.attempts):
        return None
    return rule


def claimed(context: Context) -> dict[str, Any]:
    """What ``begin`` claimed for this run: ``{"txid", "attempt", "metadata"}``."""
    value = context["ti"].xcom_pull(task_ids=BEGIN_TASK_ID)
    if not value:
        raise AirflowFailException("the begin task recorded no attempt for this run")
    return dict(value)


class _TxnOperator(BaseOperator):
    ui_color = "#e8f0fe"

    def __init__(self, *, pipeline: TxnPipeline, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def txn_log(self) -> TransactionLog:
        return TxnLogHook(txn_log_conn_id=self.pipeline.txn_log_conn_id).get_log()

    def trigger(self, txid: int, wait_for: WaitFor, attempt: int = 0) -> TxnLogTrigger:
        return TxnLogTrigger(
            txn_log_conn_id=self.pipeline.txn_log_conn_id,
            pipeline=self.pipeline.name,
            txid=txid,
            attempt=attempt,
            wait_for=wait_for,
            poll_interval=self.pipeline.poll_interval,
        )


class TxnBeginOperator(_TxnOperator):
    """Claim this run's txid: a new attempt, with its metadata initialised in txid order.

    Waits deferred while the log says to wait (``txid - 1`` not (re-)initialised, window full) or
    the source has no new data. Skips the run's work if the txid committed already.
    """

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        p = self.pipeline
        txid = run_txid(context, p.name)
        log = self.txn_log()
        log.register_pipeline(
            p.name,
            source_kind=p.source.kind,
            max_pending=p.max_pending,
            dag_id=self.dag_id,
        )
        for state in p.states:
            state.create(log.engine)
        emission = log.begin(
            p.name, txid, p.source, claim_timeout=max(CLAIM_TIMEOUT, p.lease_timeout)
        )
        if emission.action is BeginAction.ALREADY_COMMITTED:
            raise AirflowSkipException(f"pipeline={p.name} txid={txid} committed already")
        if emission.no_data:
            from datetime import timedelta

            from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

            self.log.info("pipeline=%s txid=%s: no new data yet, waiting", p.name, txid)
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=max(p.poll_interval, 1.0) * 5)),
                method_name="execute",
            )
        if not emission.emitted:
            self.log.info(
                "pipeline=%s txid=%s: waiting, %s", p.name, txid, _why_waiting(log, p, txid)
            )
            self.defer(trigger=self.trigger(txid, WaitFor.CAN_BEGIN), method_name="execute")
        self.log.info(
            "pipeline=%s txid=%s attempt=%s %s: %s",
            p.name,
            txid,
            emission.attempt,
            emission.action.value,
            emission.metadata,
        )
        return {"txid": txid, "attempt": emission.attempt, "metadata": emission.metadata}


class TxnProcessOperator(_TxnOperator):
    """Run one processing job for this run's ``(txid, attempt)`` on Spark.

    :param job: the job file (``spark_jobs/…``).
    :param finish: record the processed output when done (the only job of the txid).
    """

    def __init__(self, *, job: str, finish: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.finish = finish
        self._runner: Any = None
        self._claim: dict[str, Any] | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_txn_provider.lease import LeaseKeeper, holder_name
        from airflow_txn_provider.spark.job import BatchJob
        from airflow_txn_provider.spark.submit import SparkConnectRunner, SparkSubmitRunner

        p = self.pipeline
        self._claim = claim = claimed(context)
        job = BatchJob(p.name, claim["txid"], claim["attempt"], p.source, finish=self.finish)
        hook = TxnLogHook(txn_log_conn_id=p.txn_log_conn_id)
        log = hook.get_log()
        ti = context["ti"]
        # While this process lives it renews the attempt's lease; if it dies (SIGKILL, OOM, a
        # lost worker) the failure sensor's trigger sees the lease run out and replays the txid.
        lease = LeaseKeeper(
            log,
            p.name,
            job.txid,
            job.attempt,
            holder=holder_name(f"task {ti.task_id} of run {ti.run_id} (try {ti.try_number})"),
            timeout=p.lease_timeout,
            on_lost=self.on_kill,
            # After one of several jobs the txid still processes: time for the next task to start.
            handover=max(CLAIM_TIMEOUT, p.lease_timeout),
        )
        try:
            with lease:
                self._maybe_inject_failure(job.txid, job.attempt)
                if p.spark == "connect":
                    self._runner = SparkConnectRunner(self.job, conn_id=p.spark_connect_conn_id)
                    outcome = self._runner.run(job, log)
                    return {"status": outcome.status, "staged_rows": dict(outcome.staged_rows)}
                self._runner = SparkSubmitRunner(
                    self.job, log_url=hook.log_url(), conn_id=p.spark_conn_id, conf=p.spark_conf
                )
                self._runner.run(job)
        except BaseException as err:
            # The job fails its attempt itself when it can; this covers what it cannot see
            # (spark-submit dying, a kill). A stale attempt fails nothing.
            log.fail(p.name, job.txid, job.attempt, error=f"{self.task_id}: {err}")
            raise
        info = log.transaction(p.name, job.txid)
        return {"status": info.status.value if info else "unknown"}

    def _maybe_inject_failure(self, txid: int, attempt: int) -> None:
        from airflow.sdk import Variable

        from airflow_txn_provider.exceptions import InjectedFailure

        name = INJECT_FAILURE_VARIABLE.format(pipeline=self.pipeline.name)
        rule = injected_failure(Variable.get(name, default=None), txid, attempt)
        if rule is not None:
            if rule.delay:
                self.log.warning("failure injected by %s in %.0f s", name, rule.delay)
                time.sleep(rule.delay)
            raise InjectedFailure(
                f"injected failure (Airflow Variable {name})",
                pipeline=self.pipeline.name,
                txid=txid,
                attempt=attempt,
            )

    def on_kill(self) -> None:
        if self._runner is not None:
            self._runner.kill()


class TxnRecordProcessedOperator(_TxnOperator):
    """After several jobs of one txid: record the processed output (staged counts)."""

    def execute(self, context: Context) -> str:
        from airflow_txn_provider.state import record_processed

        claim = claimed(context)
        return record_processed(self.txn_log(), self.pipeline.name, claim["txid"], claim["attempt"])


class TxnCommitGateSensor(_TxnOperator):
    """Wait, deferred, until ``txid - 1`` committed; fail if this run's attempt went stale.

    It runs once the processing tasks ended, failed ones too (``trigger_rule="none_skipped"``): a
    task that recorded its output and then could not report success (the api-server away) leaves a
    processed txid that must still commit. Whether the output was recorded is the log's to say.
    Skipped, as before, when ``begin`` skipped the run (a rerun of a committed txid).
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_skipped")
        super().__init__(**kwargs)

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> str:
        from airflow_txn_provider.coordinator import commit_gate

        p = self.pipeline
        claim = claimed(context)
        gate = commit_gate(self.txn_log().view(p.name), claim["txid"], claim["attempt"])
        where = f"pipeline={p.name} txid={claim['txid']} attempt={claim['attempt']}"
        if gate is GateState.STALE:
            raise AirflowFailException(
                f"{where} is no longer current (failed or replaced): it will not commit"
            )
        if gate is GateState.UNFINISHED:
            raise AirflowFailException(
                f"{where}: its processing ended without recording output; the attempt is failed "
                "(by its task's failure or its lease) and the txid replays"
            )
        if gate is GateState.WAIT:
            self.defer(
                trigger=self.trigger(claim["txid"], WaitFor.COMMIT_GATE, claim["attempt"]),
                method_name="execute",
            )
        return gate.value


class TxnCommitOperator(_TxnOperator):
    """Commit ``(txid, attempt)``: apply every state and mark it committed, one DB transaction.

    Fenced by the attempt and idempotent: a duplicate run of this task applies nothing twice.
    Then it commits the next txids that are already processed, in order, without waiting for their
    own runs to wake (their commit tasks find them committed): the gap between two commits is then
    a database round trip, not a trigger poll plus a task start.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_txn_provider.state import commit_registered

        claim = claimed(context)
        log = self.txn_log()
        result = commit_registered(log, self.pipeline.name, claim["txid"], claim["attempt"])
        return {
            "applied": result.applied,
            "committed_attempt": result.committed_attempt,
            "also_committed": self._commit_processed_successors(log),
        }

    def _commit_processed_successors(self, log: TransactionLog) -> list[int]:
        from airflow_txn_provider.coordinator import committable
        from airflow_txn_provider.state import commit_registered

        done: list[int] = []
        for _ in range(self.pipeline.max_pending):
            rec = committable(log.view(self.pipeline.name))
            if rec is None:
                break
            try:
                commit_registered(log, self.pipeline.name, rec.txid, rec.attempt)
            except Exception as err:  # its own run commits it (or reports why it cannot)
                self.log.warning("txid %s left to its own run: %s", rec.txid, err)
                break
            self.log.info(
                "txid %s attempt %s was processed: committed it too", rec.txid, rec.attempt
            )
            done.append(rec.txid)
        return done


class TxnFailureSensor(_TxnOperator):
    """The failure sensor of one txid's run: restart the run when its txid fails, stop when it is
    a poison batch.

    Deferred from the claim to the end of the run (no worker slot), it wakes when the txid
    commits (the task ends in the triggerer) or when an attempt of it fails. A failure of txid k
    fails k and every later txid in flight in the log (one database transaction); the sensor of
    each of those runs then restarts its run through the Airflow REST API, so they re-begin with
    new attempts, in order, after k. A txid that failed on its own ``max_attempts`` times stops
    the pipeline (a poison batch): its failed task stays red, the run's note and this task's log
    name the txid and its error, and later txids wait for it until a person fixes the cause and
    clears its run in the UI (which also gives it a fresh ``max_attempts``; so does an Airflow
    retry of this task, as the count of failures it handled lives in its deferral).

    Only scheduled txid runs are watched: a manual run (``dag.test``) has nobody to restart it.
    """

    ui_color = "#fde8e8"

    def execute(self, context: Context) -> None:
        txid = run_txid(context, self.pipeline.name)
        if not is_scheduled_txid_run(context):
            raise AirflowSkipException("a manual run is not restarted on failure")
        # Downstream of begin, so the attempt to watch is exactly the one this run claimed: a
        # failure that came before the claim is begin's business (it re-emits), not ours.
        self._watch(txid, claimed(context)["attempt"] - 1, own_failures=0)

    def _watch(
        self, txid: int, attempt: int, *, own_failures: int, requeue: bool = False
    ) -> NoReturn:
        """Defer until the txid commits, an attempt after ``attempt`` fails, or its lease runs
        out; with ``requeue``, also if failed ``attempt`` waits too long for its run to restart."""
        self.defer(
            trigger=TxnLogTrigger(
                txn_log_conn_id=self.pipeline.txn_log_conn_id,
                pipeline=self.pipeline.name,
                txid=txid,
                attempt=attempt,
                wait_for=WaitFor.OUTCOME,
                poll_interval=self.pipeline.poll_interval,
                end_task_on_commit=True,
                requeue_timeout=REQUEUE_TIMEOUT if requeue else None,
            ),
            method_name="on_failure",
            kwargs={"own_failures": own_failures},
        )

    def on_failure(self, context: Context, event: dict[str, Any], own_failures: int = 0) -> None:
        from airflow_txn_provider.coordinator import (
            FailureResponse,
            known_failed_attempt,
            requeue_set,
            respond_to_failure,
        )

        p = self.pipeline
        txid = run_txid(context, p.name)
        state = event.get("state")
        if state == "committed":
            return
        log = self.txn_log()
        if state == "lease_expired":
            # The trigger saw the lease run out; the log decides under its lock (a renewal that
            # came meanwhile wins) and fails the attempt and every later txid in flight.
            log.expire_lease(p.name, txid, int(event["attempt"]))
        view = log.view(p.name)
        rec = view.record(txid)
        if rec is None or rec.status is not TxStatus.FAILED:  # alive, or re-begun meanwhile
            self._watch(txid, known_failed_attempt(view, txid), own_failures=own_failures)
        if state == "not_requeued":
            self.log.warning(
                "pipeline=%s txid=%s attempt=%s could replay but its run was not restarted for "
                "%.0f s (the re-queue of its cascade was lost): restarting it",
                p.name,
                txid,
                rec.attempt,
                REQUEUE_TIMEOUT,
            )
            self._restart_runs(context, [txid], rec.attempt, rec.failed_by)
            self._watch(txid, rec.attempt, own_failures=own_failures, requeue=True)
        response = respond_to_failure(rec, own_failures, p.max_attempts)
        own = own_failures + int(rec.failed_on_its_own)
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
            self._watch(txid, rec.attempt, own_failures=own, requeue=True)
        if rec.failed_on_its_own:
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
        self._watch(txid, rec.attempt, own_failures=own, requeue=True)

    def _stop(self, context: Context, txid: int, attempt: int, own: int) -> NoReturn:
        """Poison batch: say so where people look, then keep watching without restarting.

        The run stays running (this task deferred) on purpose: it keeps its ``max_active_runs``
        slot, so a Clear of this run in the UI can start it again while the later runs wait in
        theirs. A failed run would give its slot to a new, later run and the Clear would queue
        behind the runs waiting for it.
        """
        from airflow_txn_provider.coordinator import requeue_set
        from airflow_txn_provider.exceptions import PoisonBatchError

        p = self.pipeline
        last = _last_error(self.txn_log(), p.name, txid)
        error = PoisonBatchError(
            f"POISON BATCH, pipeline stopped: failed {own} times on its own "
            f"(max_attempts={p.max_attempts}), last error: {last}. Later txids wait for it. "
            "Fix the cause, then Clear this run in the Airflow UI",
            pipeline=p.name,
            txid=txid,
            attempt=attempt,
        )
        self.log.error("%s", error)
        self._api().set_run_note(context["dag"].dag_id, context["dag_run"].run_id, str(error))
        # The later txids failed with it: restart their runs now (one request), so their begins
        # wait for this txid and follow it at once when a person reruns it.
        later = [t for t in requeue_set(self.txn_log().view(p.name), txid) if t > txid]
        if later:
            self._restart_runs(context, later, attempt, txid)
        self._watch(txid, attempt, own_failures=own)

    def _api(self) -> Any:
        from airflow_txn_provider.hooks.airflow_api import AirflowApiHook

        return AirflowApiHook(self.pipeline.airflow_api_conn_id)

    def _restart_runs(
        self, context: Context, txids: Sequence[int], attempt: int, failed_by: int | None
    ) -> None:
        """Restart the work of the runs of ``txids`` (consecutive) in one REST request, as a
        person's Clear would. The failure sensors are not cleared: each keeps watching its txid.

        First it waits (up to ``SETTLE_TIMEOUT``) until those runs' tasks have settled: a commit
        gate whose attempt went stale is failing, a processing task whose lease was lost is
        stopping. Clearing a task instance while the scheduler or the triggerer is updating it
        makes theirs fail with ``StaleDataError``, which kills that Airflow component. Runs
        beyond them are not touched: their begins wait, and go on by themselves.
        """
        from airflow_txn_provider.exceptions import RequeueError
        from airflow_txn_provider.timetables import txid_logical_date

        dag = context["dag"]
        origin = failed_by or txids[0]
        work = [t for t in dag.task_ids if t != self.task_id]
        # A deferred begin of a failed txid is quiet: it may begin only after the txid before it,
        # failed too, begins again, which takes this very clear.
        busy_ones = [t for t in work if t != BEGIN_TASK_ID]
        self._wait_until_settled(dag.dag_id, [txid_run_id(t) for t in txids], busy_ones)
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
                pipeline=self.pipeline.name,
                txid=txids[0],
                attempt=attempt,
            ) from None
        self.log.info("restarted the runs of %s: cleared %s", which, cleared)

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
                if ti["task_id"] in tasks and ti["state"] in BUSY_STATES
            ]
            if not busy:
                return
            if time.monotonic() > deadline:
                self.log.warning("restarting runs although still busy: %s", ", ".join(busy))
                return
            self.log.info("waiting for the failed runs' tasks to settle: %s", ", ".join(busy))
            time.sleep(1.0)


def _last_error(log: TransactionLog, pipeline: str, txid: int) -> str:
    info = log.transaction(pipeline, txid)
    return (info.last_error if info else None) or "(none recorded)"


def _why_waiting(log: TransactionLog, pipeline: TxnPipeline, txid: int) -> str:
    """Which txid this one waits for, and why: what the UI and a person reading the log need."""
    from airflow_txn_provider.coordinator import blocked_by

    view = log.view(pipeline.name)
    blocker = blocked_by(view, txid)
    if blocker is not None:
        error = _last_error(log, pipeline.name, blocker.txid)
        return f"blocked by txid {blocker.txid} (failed, attempt {blocker.attempt}: {error})"
    if txid > view.next_new_txid:
        return f"txid {txid - 1} has not begun yet"
    return (
        f"window full: txids {view.window.start}..{view.window.stop - 1} in flight "
        f"(max_pending={pipeline.max_pending})"
    )


def fail_attempt_on_task_failure(context: Context) -> None:
    """``on_failure_callback`` of a processing task: Airflow failed the task (it raised, timed
    out, or its process stopped heartbeating), so its attempt will report nothing: fail it now
    rather than when its lease runs out. Best effort: the lease is the guarantee."""
    ti = context["ti"]
    task = context.get("task")
    pipeline = getattr(task, "pipeline", None)
    if pipeline is None:
        return
    try:
        claim = claimed(context)
        error = f"task {ti.task_id} (try {ti.try_number}) failed in Airflow"
        exception = context.get("exception")
        if exception is not None:
            error += f": {type(exception).__name__}: {str(exception)[:500]}"
        TxnLogHook(txn_log_conn_id=pipeline.txn_log_conn_id).get_log(migrate=False).fail(
            pipeline.name, claim["txid"], claim["attempt"], error=error
        )
    except Exception:  # never mask the task's own failure; the lease catches what this misses
        logging.getLogger(__name__).exception(
            "pipeline=%s: could not fail the attempt of task %s", pipeline.name, ti.task_id
        )


def job_task_id(job: str) -> str:
    return f"process_{Path(job).stem}"
