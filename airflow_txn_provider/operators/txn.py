"""The tasks of one txid's DAG run that claim and process it (its commit:
:mod:`airflow_txn_provider.operators.commit`): thin over the transaction log and its rules.

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
from airflow_txn_provider.failure_injection import maybe_inject_failure
from airflow_txn_provider.operators.run_retention import prune_airflow_runs
from airflow_txn_provider.preload import task_process_warmth
from airflow_txn_provider.rules.config import CLAIM_TIMEOUT
from airflow_txn_provider.rules.vocabulary import BeginAction
from airflow_txn_provider.rules.waiting import TxnEvent
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
    why_waiting,
    window_moved,
)
from airflow_txn_provider.transactions.commit import commit_ready
from airflow_txn_provider.transactions.lease import LeaseKeeper, holder_name
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from airflow_txn_provider.triggers.waker import start_making_runs
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


def is_plain_text(value: str, jinja_env: Any, task: Any) -> bool:
    """Whether rendering ``value`` with ``jinja_env`` would give it back unchanged: no start of a
    Jinja block, variable, comment or line statement in it, no trailing newline (Jinja drops one),
    not a template file's name, and a string rendering (a native one may turn ``"12"`` into 12)."""
    from jinja2.nativetypes import NativeEnvironment

    if jinja_env is None or isinstance(jinja_env, NativeEnvironment):
        return False
    if value.endswith("\n") or value.endswith(tuple(task.template_ext)):
        return False
    marks = (
        jinja_env.block_start_string,
        jinja_env.variable_start_string,
        jinja_env.comment_start_string,
        jinja_env.line_statement_prefix,
        jinja_env.line_comment_prefix,
    )
    return not any(mark and mark in value for mark in marks)


class TxnOperator(TxidLineage, BaseOperator):
    """An operator of a pipeline's DAG.

    :param txn_pipeline: the pipeline.
    :param claim_task_id: the task of the run that claims its txid (``begin``, or the processing
        task of a pipeline with one job); the others read the claim from its XCom.
    """

    ui_color = "#e8f0fe"
    template_fields: Sequence[str] = (PIPELINE_FIELD,)

    def __init__(
        self, *, txn_pipeline: TxnPipeline, claim_task_id: str = BEGIN_TASK_ID, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.txn_pipeline = txn_pipeline
        self.claim_task_id = claim_task_id
        self.pipeline_name = (
            txn_pipeline.name
        )  # PIPELINE_FIELD (a name has no Jinja: rendered as is)
        self._lineage_claim: dict[str, Any] | None = None
        self._making_runs_ahead: threading.Thread | None = None

    def render_template(
        self,
        content: Any,
        context: Context,
        jinja_env: Any = None,
        seen_oids: set[int] | None = None,
    ) -> Any:
        """Airflow's rendering, except for a string with no Jinja in it (a pipeline's name, a job
        path), which is its own rendering: Airflow compiles every templated string, at a cost in
        a task's CPU per field and txid."""
        if isinstance(content, str) and is_plain_text(content, jinja_env, self):
            return content
        return super().render_template(content, context, jinja_env, seen_oids)

    def txlog(self) -> TransactionLog:
        return pipeline_log(self.txn_pipeline)

    def txn_log_url(self) -> str:
        return pipeline_log_url(self.txn_pipeline)

    def resumed_with(self, event: Any) -> TxnEvent | None:
        """The log trigger's event this task resumed with, checked
        (:class:`~airflow_txn_provider.rules.exceptions.MalformedEventError` if it is not one);
        ``None`` at a first start or after the no-data timer (whose event is its moment)."""
        if event is None or isinstance(event, datetime):
            return None
        return TxnEvent.from_payload(event, pipeline=self.txn_pipeline.name)

    def trigger(
        self, txid: int, wait_for: WaitFor, attempt: int = 0, *, end_task_on_commit: bool = False
    ) -> TxnLogTrigger:
        return TxnLogTrigger(
            txn_log_conn_id=self.txn_pipeline.txn_log_conn_id,
            pipeline=self.txn_pipeline.name,
            txid=txid,
            attempt=attempt,
            wait_for=wait_for,
            poll_interval=self.txn_pipeline.poll_interval,
            end_task_on_commit=end_task_on_commit,
        )

    def claim(self, context: Context, *, publish: bool = True) -> dict[str, Any]:
        """Claim this run's txid: a new attempt, with its metadata initialised in txid order.

        Defers (re-entering ``execute``) while the log says to wait (``txid - 1`` not
        (re-)initialised, window full) or the source has no new data; skips the run's work if the
        txid committed already. With ``publish``, the claim goes to XCom (``CLAIM_XCOM_KEY``) for
        the run's other tasks now; else :meth:`publish_claim` does, if they are to run.
        """
        p = self.txn_pipeline
        txid = run_txid(context, p.name)
        txlog = self.txlog()
        # One read when the log holds this declaration already (every no-data poll comes here).
        declare_pipeline(txlog, p, self.dag_id)
        deadline = time.monotonic() + AHEAD_WAIT
        # A run made ahead waits here, not deferred, for the begin before it or for the window
        while True:
            emission = txlog.begin(
                p.name,
                txid,
                p.source,
                claim_timeout=max(CLAIM_TIMEOUT, p.lease_timeout),
                # A failed attempt replays when its failure sensor (or a person) restarts the run,
                # never on an Airflow retry (an attempt behind the sensor's count).
                replay=not is_airflow_retry(context["ti"], self.retries),
            )
            waits = emission.action in (BeginAction.WAIT_PREVIOUS, BeginAction.WAIT_WINDOW)
            if waits and window_moved(txlog, p.name, txid, deadline):
                continue  # a run made past the window: its turn came
            if emission.action is BeginAction.WAIT_PREVIOUS and previous_began(
                txlog, p.name, txid, deadline
            ):
                continue  # the txid before it began (their runs were made together)
            break
        if emission.action is BeginAction.NOT_REPLAYED:
            failed = txlog.transaction(p.name, txid)
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
                "pipeline=%s txid=%s: waiting, %s", p.name, txid, why_waiting(txlog, p, txid)
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
        self._lineage_claim = claim
        if publish:
            context["ti"].xcom_push(key=CLAIM_XCOM_KEY, value=claim)
        if is_scheduled_txid_run(context):  # a manual run (dag.test) has no run after it
            self._making_runs_ahead = start_making_runs(p, self.dag_id, txid, txlog, self.log)
        return claim

    def join_chain(self) -> None:
        """Wait (a few seconds at most) for the thread that makes the later txids' runs (see
        :func:`~airflow_txn_provider.triggers.waker.start_making_runs`): the task's end must not
        cut it off."""
        if self._making_runs_ahead is not None:
            self._making_runs_ahead.join(timeout=15.0)
            self._making_runs_ahead = None

    def claimed(self, context: Context, *, from_log: bool = False) -> dict[str, Any]:
        """What the run's claiming task claimed (:func:`~airflow_txn_provider.run_context.
        claimed`; ``from_log``: or, if it published none, the attempt the log holds)."""
        txlog = self.txlog() if from_log else None
        self._lineage_claim = claimed(
            context, self.claim_task_id, txlog=txlog, pipeline=self.txn_pipeline.name
        )
        return self._lineage_claim


class TxnBeginOperator(TxnOperator):
    """Claim this run's txid (see :meth:`TxnOperator.claim`), for a pipeline of several jobs:
    they then process it in parallel. With one job, its processing task claims by itself."""

    reads_batch = True  # it fixes the batch

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        self.resumed_with(event)  # the claim asks the log again: the event only has to be ours
        try:
            return self.claim(context)
        finally:
            self.join_chain()


class TxnProcessOperator(TxnOperator):
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
        self.resumed_with(event)  # the claim asks the log again: the event only has to be ours
        if self.txn_pipeline.spark == "connect":
            self.log.info("pipeline=%s: %s", self.txn_pipeline.name, task_process_warmth())
        # The claim is published only if the run goes on to its commit task: when this task
        # commits its txid and ends the run, no task reads it (a request to the api-server less).
        claim = self.claim(context, publish=False) if self.claims else self.claimed(context)
        try:
            result = self._process(context, claim)
        except Exception as err:
            self.publish_claim(context)  # the commit task runs after a failure too
            # A claimed attempt is replayed by the failure sensor, in order, with a new attempt:
            # never by an Airflow retry of this task (retries cover the claim, and a lost process).
            raise AirflowFailException(f"{type(err).__name__}: {err}") from err
        finally:
            self.join_chain()
        if self.finish and result.get("status") == "processed":
            committed = commit_ready(self.txlog(), self.txn_pipeline, self.log)
            own = claim["txid"] in committed
            if not own and self.ends_its_run(context):  # wait for the txids before it
                own, more = commit_in_turn(self.txlog(), self.txn_pipeline, claim["txid"], self.log)
                committed += more
            result["committed"] = committed
            prune_airflow_runs(self.txn_pipeline, self.dag_id, committed, self.log)
            if own and self.ends_its_run(context):
                # No return value to XCom: nothing reads it once the run ends here, and each
                # push is a request to the api-server per txid (the log line says the same).
                self.log.info(
                    "pipeline=%s txid=%s committed by this task (%s): its run's commit and "
                    "watch_failures have nothing left to do (skipped)",
                    self.txn_pipeline.name,
                    claim["txid"],
                    result,
                )
                raise DownstreamTasksSkipped(tasks=[COMMIT_TASK_ID, WATCH_TASK_ID])
        self.publish_claim(context)
        return result

    def publish_claim(self, context: Context) -> None:
        """Put the claim this task made (``claim(publish=False)``) in XCom for the run's other
        tasks. Best effort: the commit task reads the log when it finds none."""
        if self.claims and self._lineage_claim is not None:
            try:
                context["ti"].xcom_push(key=CLAIM_XCOM_KEY, value=self._lineage_claim)
            except Exception as err:
                self.log.warning(
                    "pipeline=%s: claim not published (%s)", self.txn_pipeline.name, err
                )

    def ends_its_run(self, context: Context) -> bool:
        """Whether this task ends its run once it committed its own txid: the run's commit would
        find it committed and end in the triggerer, and its failure watch has nothing left to
        watch, yet each would cost Airflow a trigger and a success callback, which the
        dag-processor answers by parsing the DAG file. Not
        when the commit has work of its own (Asset events of lake sinks, OpenLineage), nor
        outside a txid's scheduled run (``dag.test``)."""
        return (
            is_scheduled_txid_run(context) and not self.txn_pipeline.sinks and not lineage_enabled()
        )

    def _process(self, context: Context, claim: dict[str, Any]) -> dict[str, Any]:
        # at call time: at the top they add to a DAG file's parse (the runners, the
        # job and the log's write side: 9 modules)
        from airflow_txn_provider.operators import spark_runner
        from airflow_txn_provider.spark.audit import for_job
        from airflow_txn_provider.spark.job import BatchJob

        p = self.txn_pipeline
        job = BatchJob(
            p.name,
            claim["txid"],
            claim["attempt"],
            p.source,
            finish=self.finish,
            sinks=tuple(p.sinks),
            fit_window=p.fits_window,
            expectations=for_job(p.expectations, p.sinks),  # the input's and lake sinks'
        )
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        hook = TxnLogHook(txn_log_conn_id=p.txn_log_conn_id)
        txlog = hook.get_log()
        ti = context["ti"]
        # While this process lives it renews the attempt's lease; if it dies (SIGKILL, OOM, a
        # lost worker) the failure sensor's trigger sees the lease run out and replays the txid.
        lease = LeaseKeeper(
            txlog,
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
                    outcome = self._runner.run(job, txlog, holder=lease.holder)
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
            txlog.fail(
                p.name,
                job.txid,
                job.attempt,
                error=f"{self.task_id}: {err}",
                of_processing=True,
                holder=lease.holder,
            )
            raise
        info = txlog.transaction(p.name, job.txid)
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


def job_task_id(job: str) -> str:
    return f"process_{Path(job).stem}"
