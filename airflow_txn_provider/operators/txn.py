"""The tasks of one txid's DAG run: thin over the transaction log and its rules.

``begin`` → ``process_<job>`` (one per job, in parallel) → [``processed``] → ``commit_gate`` →
``commit``; beside them ``watch_failures``. Every decision is the log's (and so the coordinator's):
these operators only claim, wait (deferred: no worker slot), run, and report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_txn_provider.coordinator import BeginAction, GateState
from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.timetables import txid_from_run_id
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transaction_log import TransactionLog

BEGIN_TASK_ID = "begin"


def run_txid(context: Context, pipeline: str) -> int:
    """The txid of the running DAG run (from its run id ``txid-000042``)."""
    run_id = context["dag_run"].run_id
    txid = txid_from_run_id(run_id)
    if txid is None:
        raise AirflowFailException(
            f"pipeline={pipeline}: run {run_id!r} is not a transaction (run ids are txid-000042); "
            "transactions start by themselves once the DAG is unpaused, do not trigger them"
        )
    return txid


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
        log.register_pipeline(p.name, source_kind=p.source.kind, max_pending=p.max_pending)
        for state in p.states:
            state.create(log.engine)
        emission = log.begin(p.name, txid, p.source)
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
            self.log.info("pipeline=%s txid=%s: %s, waiting", p.name, txid, emission.action.value)
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
        from airflow_txn_provider.spark.job import BatchJob
        from airflow_txn_provider.spark.submit import SparkConnectRunner, SparkSubmitRunner

        p = self.pipeline
        self._claim = claim = claimed(context)
        job = BatchJob(p.name, claim["txid"], claim["attempt"], p.source, finish=self.finish)
        hook = TxnLogHook(txn_log_conn_id=p.txn_log_conn_id)
        log = hook.get_log()
        try:
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
    """Wait, deferred, until ``txid - 1`` committed; fail if this run's attempt went stale."""

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> str:
        from airflow_txn_provider.coordinator import commit_gate

        p = self.pipeline
        claim = claimed(context)
        gate = commit_gate(self.txn_log().view(p.name), claim["txid"], claim["attempt"])
        if gate is GateState.STALE:
            raise AirflowFailException(
                f"pipeline={p.name} txid={claim['txid']} attempt={claim['attempt']} is no longer "
                "current (failed or replaced): it will not commit"
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
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_txn_provider.state import commit_registered

        claim = claimed(context)
        result = commit_registered(
            self.txn_log(), self.pipeline.name, claim["txid"], claim["attempt"]
        )
        return {"applied": result.applied, "committed_attempt": result.committed_attempt}


def job_task_id(job: str) -> str:
    return f"process_{Path(job).stem}"
