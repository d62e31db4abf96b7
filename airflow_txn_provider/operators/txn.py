"""The tasks of one txid's DAG run: thin over the transaction log and its rules.

One job: ``process_<job>`` (claims the txid, processes it, commits what is ready) → ``commit``.
Several jobs: ``begin`` → ``process_<job>`` (in parallel) → ``processed`` → ``commit``. Beside
them, from the run's start, ``watch_failures`` (:mod:`airflow_txn_provider.sensors.txn_failure`).
Every decision is the log's (and so the coordinator's): these operators only claim, wait
(deferred: no worker slot), run, and report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_txn_provider.compat.airflow import (
    AirflowFailException,
    AirflowSkipException,
    DownstreamTasksSkipped,
)
from airflow_txn_provider.operators.run_retention import prune_airflow_runs
from airflow_txn_provider.rules.config import CLAIM_TIMEOUT
from airflow_txn_provider.rules.vocabulary import BeginAction
from airflow_txn_provider.rules.waiting import GateState, TxnEvent, commit_gate
from airflow_txn_provider.run_context import (
    AHEAD_WAIT,
    BEGIN_TASK_ID,
    CLAIM_XCOM_KEY,
    COMMIT_TASK_ID,
    WATCH_TASK_ID,
    claimed,
    commit_in_turn,
    declare_pipeline,
    is_scheduled_txid_run,
    pipeline_log,
    pipeline_log_url,
    previous_began,
    run_txid,
    start_in_triggerer,
    why_waiting,
    window_moved,
)
from airflow_txn_provider.triggers.txn_log import RUN_TXID, TxnLogTrigger, WaitFor
from airflow_txn_provider.utils.credentials import connection_env
from airflow_txn_provider.utils.lineage import TxidLineage, lineage_enabled

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

PIPELINE_FIELD = "pipeline_name"
"""The operators' attribute holding their pipeline's name: a template field, so Airflow keeps it
in the serialized DAG, where the Transactions page reads which pipeline a DAG runs now (a
pairing the claiming task recorded counts only while the DAG still declares that pipeline)."""


def is_airflow_retry(ti: Any, retries: int | None) -> bool:
    """Whether task instance ``ti`` (of a task with ``retries``) is in an Airflow retry of a failed
    try, not in the first try since its run started or was cleared: a clear raises ``max_tries``
    to ``try_number + retries``, a retry does not (Airflow's ``get_first_reschedule_date`` finds
    a task's first try the same way)."""
    return int(ti.try_number) > int(ti.max_tries) - int(retries or 0) + 1


class _TxnOperator(TxidLineage, BaseOperator):
    """An operator of a pipeline's DAG.

    :param pipeline: the pipeline.
    :param claim_task_id: the task of the run that claims its txid (``begin``, or the processing
        task of a pipeline with one job); the others read the claim from its XCom.
    """

    ui_color = "#e8f0fe"
    template_fields: Sequence[str] = (PIPELINE_FIELD,)

    def __init__(
        self, *, pipeline: TxnPipeline, claim_task_id: str = BEGIN_TASK_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.claim_task_id = claim_task_id
        self.pipeline_name = pipeline.name  # PIPELINE_FIELD (a name has no Jinja: rendered as is)
        self._lineage_claim: dict[str, Any] | None = None
        self._chain: threading.Thread | None = None

    def txn_log(self) -> TransactionLog:
        return pipeline_log(self.pipeline)

    def txn_log_url(self) -> str:
        return pipeline_log_url(self.pipeline)

    def woken_by(self, event: Any) -> TxnEvent | None:
        """The log trigger's event this task resumed with, checked
        (:class:`~airflow_txn_provider.rules.exceptions.MalformedEventError` if it is not one);
        ``None`` at a first start or after the no-data timer (whose event is its moment)."""
        if event is None or isinstance(event, datetime):
            return None
        return TxnEvent.from_payload(event, pipeline=self.pipeline.name)

    def trigger(
        self, txid: int, wait_for: WaitFor, attempt: int = 0, *, end_task_on_commit: bool = False
    ) -> TxnLogTrigger:
        return TxnLogTrigger(
            txn_log_conn_id=self.pipeline.txn_log_conn_id,
            pipeline=self.pipeline.name,
            txid=txid,
            attempt=attempt,
            wait_for=wait_for,
            poll_interval=self.pipeline.poll_interval,
            end_task_on_commit=end_task_on_commit,
        )

    def claim(self, context: Context) -> dict[str, Any]:
        """Claim this run's txid: a new attempt, with its metadata initialised in txid order.

        Defers (re-entering ``execute``) while the log says to wait (``txid - 1`` not
        (re-)initialised, window full) or the source has no new data; skips the run's work if the
        txid committed already. The claim goes to XCom (``CLAIM_XCOM_KEY``) for the run's other
        tasks.
        """
        p = self.pipeline
        txid = run_txid(context, p.name)
        log = self.txn_log()
        # One read when the log holds this declaration already (every no-data poll comes here).
        declare_pipeline(log, p, self.dag_id)
        deadline = time.monotonic() + AHEAD_WAIT
        # A run made ahead waits here, not deferred, for the begin before it or for the window
        while True:
            emission = log.begin(
                p.name,
                txid,
                p.source,
                claim_timeout=max(CLAIM_TIMEOUT, p.lease_timeout),
                # A failed attempt replays when its failure sensor (or a person) restarts the run,
                # never on an Airflow retry (an attempt behind the sensor's count).
                replay=not is_airflow_retry(context["ti"], self.retries),
            )
            if emission.action is BeginAction.WAIT_PREVIOUS:
                if not previous_began(log, p.name, txid, deadline):
                    break
            elif not (
                emission.action is BeginAction.WAIT_WINDOW
                and window_moved(log, p.name, txid, deadline)
            ):
                break
        if emission.action is BeginAction.NOT_REPLAYED:
            failed = log.transaction(p.name, txid)
            raise AirflowFailException(
                f"pipeline={p.name} txid={txid} attempt={failed.attempt if failed else None} "
                f"failed ({(failed.last_error if failed else None) or '(none recorded)'}); an "
                "Airflow retry of this task does not replay it: the run's failure sensor "
                "re-queues the txid, or stops at a poison batch"
            )
        if emission.action is BeginAction.ALREADY_COMMITTED:
            raise AirflowSkipException(f"pipeline={p.name} txid={txid} committed already")
        if emission.no_data:
            from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

            self.log.info("pipeline=%s txid=%s: no new data yet, waiting", p.name, txid)
            self.defer(
                trigger=TimeDeltaTrigger(timedelta(seconds=max(p.poll_interval, 1.0) * 5)),
                method_name="execute",
            )
        if not emission.emitted:
            self.log.info(
                "pipeline=%s txid=%s: waiting, %s", p.name, txid, why_waiting(log, p, txid)
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
        claim = {"txid": txid, "attempt": emission.attempt, "metadata": emission.metadata}
        context["ti"].xcom_push(key=CLAIM_XCOM_KEY, value=claim)
        self._lineage_claim = claim
        if is_scheduled_txid_run(context):  # a manual run (dag.test) has no run after it
            from airflow_txn_provider.triggers.waker import start_making_runs

            self._chain = start_making_runs(p, self.dag_id, txid, log, self.log)
        return claim

    def join_chain(self) -> None:
        """Wait (a few seconds at most) for the thread that makes the later txids' runs (see
        :func:`~airflow_txn_provider.triggers.waker.start_making_runs`): the task's end must not
        cut it off."""
        if self._chain is not None:
            self._chain.join(timeout=15.0)
            self._chain = None

    def claimed(self, context: Context) -> dict[str, Any]:
        """What the run's claiming task claimed (:func:`~airflow_txn_provider.run_context.
        claimed`)."""
        self._lineage_claim = claimed(context, self.claim_task_id)
        return self._lineage_claim


class TxnBeginOperator(_TxnOperator):
    """Claim this run's txid (see :meth:`_TxnOperator.claim`), for a pipeline of several jobs:
    they then process it in parallel. With one job, its processing task claims by itself."""

    reads_batch = True  # it fixes the batch

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        self.woken_by(event)  # the claim asks the log again: the event only has to be ours
        try:
            return self.claim(context)
        finally:
            self.join_chain()


class TxnProcessOperator(_TxnOperator):
    """Run one processing job for this run's ``(txid, attempt)`` on Spark.

    With ``claim``, the task first claims the txid itself (no separate ``begin`` task: one task
    start less per txid). With ``finish``, it records the processed output and then commits what
    may commit now, its own txid first if ``txid - 1`` committed: the run's ``commit`` task then
    finds it committed.

    :param job: the job file (``spark_jobs/…``).
    :param finish: record the processed output when done (the only job of the txid).
    :param claim: claim the txid first (the only job of the txid).
    """

    template_fields: Sequence[str] = ("job", PIPELINE_FIELD)
    reads_batch = True  # the lineage names the source as its input

    def __init__(
        self, *, job: str, finish: bool = True, claim: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.finish = finish
        self.claims = claim
        self._runner: Any = None
        self._lease: Any = None
        self.stopped = False
        """Set by :meth:`on_kill`: this try reports no failure of its attempt."""

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        self.woken_by(event)  # the claim asks the log again: the event only has to be ours
        if self.pipeline.spark == "connect":
            from airflow_txn_provider.preload import task_process_warmth

            self.log.info("pipeline=%s: %s", self.pipeline.name, task_process_warmth())
        claim = self.claim(context) if self.claims else self.claimed(context)
        try:
            result = self._process(context, claim)
        except Exception as err:
            # A claimed attempt is replayed by the failure sensor, in order, with a new attempt:
            # never by an Airflow retry of this task (retries cover the claim, and a lost process).
            raise AirflowFailException(f"{type(err).__name__}: {err}") from err
        finally:
            self.join_chain()
        if self.finish and result.get("status") == "processed":
            from airflow_txn_provider.transactions.commit import commit_ready

            committed = commit_ready(self.txn_log(), self.pipeline, self.log)
            own = claim["txid"] in committed
            if not own and self.ends_its_run(context):  # wait for the txids before it
                own, more = commit_in_turn(self.txn_log(), self.pipeline, claim["txid"], self.log)
                committed += more
            result["committed"] = committed
            prune_airflow_runs(self.pipeline, self.dag_id, committed, self.log)
            if own and self.ends_its_run(context):
                context["ti"].xcom_push(key="return_value", value=result)
                self.log.info(
                    "pipeline=%s txid=%s committed by this task: its run's commit and "
                    "watch_failures have nothing left to do (skipped)",
                    self.pipeline.name,
                    claim["txid"],
                )
                raise DownstreamTasksSkipped(tasks=[COMMIT_TASK_ID, WATCH_TASK_ID])
        return result

    def ends_its_run(self, context: Context) -> bool:
        """Whether this task ends its run once it committed its own txid: the run's commit would
        find it committed and end in the triggerer, and its failure watch has nothing left to
        watch, yet each would cost Airflow a trigger and a success callback, which the
        dag-processor answers by parsing the DAG file (``make bench-peer``'s floor table). Not
        when the commit has work of its own (Asset events of lake sinks, OpenLineage), nor
        outside a txid's scheduled run (``dag.test``)."""
        return is_scheduled_txid_run(context) and not self.pipeline.sinks and not lineage_enabled()

    def _process(self, context: Context, claim: dict[str, Any]) -> dict[str, Any]:
        from airflow_txn_provider.failure_injection import maybe_inject_failure
        from airflow_txn_provider.operators import spark_runner
        from airflow_txn_provider.spark.job import BatchJob
        from airflow_txn_provider.transactions.lease import LeaseKeeper, holder_name

        p = self.pipeline
        job = BatchJob(
            p.name,
            claim["txid"],
            claim["attempt"],
            p.source,
            finish=self.finish,
            sinks=tuple(p.sinks),
            fit_window=p.fits_window,
        )
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

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
        self._lease = lease
        try:
            with lease:
                maybe_inject_failure(p.name, job.txid, job.attempt)
                if p.spark == "connect":
                    self._runner = spark_runner.SparkConnectRunner(
                        self.job,
                        conn_id=p.spark_connect_conn_id,
                        reuse_sessions=p.reuse_spark_sessions,
                    )
                    outcome = self._runner.run(job, log, holder=lease.holder)
                    return {"status": outcome.status, "staged_rows": dict(outcome.staged_rows)}
                self._runner = spark_runner.SparkSubmitRunner(
                    self.job,
                    log_url=hook.log_url(),
                    conn_id=p.spark_conn_id,
                    conf=p.spark_conf,
                    # the source's and sinks' connections, for the driver: environment, never
                    # arguments
                    env={
                        **connection_env(c for sink in p.sinks for c in sink.conn_ids),
                        **p.source.driver_env(),
                    },
                )
                self._runner.run(job)
        except BaseException as err:
            if self.stopped:  # its error is the stop's: the stopper decides (on_kill)
                msg = "pipeline=%s txid=%s attempt=%s stopped, not reported as failed: %s"
                self.log.warning(msg, p.name, job.txid, job.attempt, err)
                raise
            # The job fails its attempt itself when it can; this covers what it cannot see
            # (spark-submit dying). A stale attempt fails nothing, an attempt whose output the
            # job recorded before the bad exit keeps it (it commits), and one that a later try
            # of this task took over is left to that try.
            log.fail(
                p.name,
                job.txid,
                job.attempt,
                error=f"{self.task_id}: {err}",
                of_processing=True,
                holder=lease.holder,
            )
            raise
        info = log.transaction(p.name, job.txid)
        return {"status": info.status.value if info else "unknown"}

    def on_kill(self) -> None:
        """Airflow stopped this try, or its lease is lost: stop its own Spark work, renew no
        more, report no failure. Airflow stops a try it put up for retry while it ran (a stale
        event after a deferral, apache/airflow#72716): the next try resumes the attempt."""
        self.stopped = True  # first: the interruption's error must find it set
        if self._lease is not None:
            self._lease.abandon()
        if self._runner is not None:
            self._runner.kill()


class TxnRecordProcessedOperator(_TxnOperator):
    """After several jobs of one txid: record the processed output (staged counts)."""

    def execute(self, context: Context) -> str:
        from airflow_txn_provider.transactions.commit import commit_ready, record_processed

        claim = self.claimed(context)
        action = record_processed(
            self.txn_log(), self.pipeline.name, claim["txid"], claim["attempt"]
        )
        committed = commit_ready(self.txn_log(), self.pipeline, self.log)
        prune_airflow_runs(self.pipeline, self.dag_id, committed, self.log)
        return action


class TxnCommitOperator(_TxnOperator):
    """Commit ``(txid, attempt)`` in txid order: wait, deferred, until ``txid - 1`` committed,
    then apply every state and mark it committed, in one DB transaction.

    Usually it finds the txid committed already, by its own processing task or by the commit of
    an earlier txid, which commits the processed txids after it in order. Fenced by the attempt
    and idempotent: a duplicate run applies nothing twice. It fails if the attempt went stale.

    It runs once processing ended, failed tasks too (``trigger_rule="none_skipped"``): a task
    that recorded its output and then could not report success (the api-server away) leaves a
    processed txid that must still commit. Whether the output was recorded is the log's to say.
    Skipped, as before, when the claim skipped the run (a rerun of a committed txid).
    """

    commits = True  # its lineage has outputs once its attempt committed

    def __init__(self, *, triggerer_start: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_skipped")
        super().__init__(**kwargs)
        if self.pipeline.sinks and not self.outlets:
            # An Asset event per committed txid: downstream DAGs schedule on committed data only.
            self.outlets = self.pipeline.assets
        # Usually the txid committed already (its processing task commits what is ready): the
        # task then ends in the triggerer. It wakes on a worker to commit, to fail a stale
        # attempt, or to emit its Asset events or OpenLineage outputs (a task ending in the
        # triggerer emits none).
        ends_in_triggerer = not self.outlets and not lineage_enabled()
        start_in_triggerer(
            self,
            self.trigger(RUN_TXID, WaitFor.COMMITTED, end_task_on_commit=ends_in_triggerer),
            "execute_complete",
            enabled=triggerer_start,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        return self._commit_or_wait(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the triggerer: ``txid - 1`` committed (or this attempt went stale, or the
        txid committed meanwhile; or, started there, the txid needs this task). The gate is asked
        again: the log, not the event, decides (the event is only checked to be one)."""
        self.woken_by(event)
        return self._commit_or_wait(context)

    def _commit_or_wait(self, context: Context) -> dict[str, Any]:
        from airflow_txn_provider.transactions.commit import commit_ready, commit_registered

        p = self.pipeline
        claim = self.claimed(context)
        txid, attempt = claim["txid"], claim["attempt"]
        log = self.txn_log()
        gate = commit_gate(log.view(p.name), txid, attempt)
        where = f"pipeline={p.name} txid={txid} attempt={attempt}"
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
                trigger=self.trigger(txid, WaitFor.COMMIT_GATE, attempt),
                method_name="execute_complete",
            )
        if gate is GateState.COMMITTED:
            self.log.info("%s committed already", where)
            self._announce(context, log, txid)
            return {"applied": False, "also_committed": []}
        result = commit_registered(log, p.name, txid, attempt, p.sinks)
        also = commit_ready(log, p, self.log)
        prune_airflow_runs(p, self.dag_id, [txid, *also] if result.applied else also, self.log)
        self._announce(context, log, txid)
        return {
            "applied": result.applied,
            "committed_attempt": result.committed_attempt,
            "also_committed": also,
        }

    def _announce(self, context: Context, log: TransactionLog, txid: int) -> None:
        """The extra of the Asset event this task's success emits: which txid, which version."""
        if not self.pipeline.sinks:
            return
        info = log.transaction(self.pipeline.name, txid)
        output = (info.output if info is not None else None) or {}
        for sink, asset in zip(self.pipeline.sinks, self.pipeline.assets, strict=True):
            commit = (output.get(sink.output_key) or {}).get("commit") or {}
            context["outlet_events"][asset].extra = {
                "pipeline": self.pipeline.name,
                "txid": txid,
                "version": commit.get("version"),
                "rows": commit.get("rows", 0),
            }


def job_task_id(job: str) -> str:
    return f"process_{Path(job).stem}"
