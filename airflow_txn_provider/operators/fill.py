"""The fill DAG's task: fill a pipeline's outputs from history, beside its live txids.

One run at a time of the fill DAG (:func:`~airflow_txn_provider.dag_builder.build_fill_dag`): it
declares the pipeline as its DAG file says, waits in the triggerer while no output fills
(:class:`~airflow_txn_provider.triggers.fill.TxnFillDueTrigger`), then fills every filling output
on a worker (:func:`~airflow_txn_provider.spark.fill.fill_pipeline`) until they join the live
commits. Airflow retries it with backoff, and a retry takes the fill over from its fenced progress
in the log. Its Spark: the pipeline's Spark Connect server, or, for ``spark="submit"``, a driver
in this process on the ``spark`` connection's master (``local[*]`` without one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator

from airflow_txn_provider.log.fill_progress import filling_outputs
from airflow_txn_provider.operators.txn import PIPELINE_FIELD
from airflow_txn_provider.rules.filling import FILL_CHUNK
from airflow_txn_provider.run_context import declare_pipeline, pipeline_log
from airflow_txn_provider.spark.connect_sessions import keep_classic_mode
from airflow_txn_provider.triggers.fill import FILL_POLL_INTERVAL, TxnFillDueTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pyspark.sql import SparkSession

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.spark.job import Transform

FILL_TASK_ID = "fill_from_history"


class TxnFillOperator(BaseOperator):
    """Fill the outputs of ``txn_pipeline`` declared ``start={name: "history"}``, then end.

    :param txn_pipeline: the pipeline.
    :param chunk: txids one fill job computes at once.
    :param poll_interval: seconds between the idle task's looks at the log (in the triggerer).
    :param pipeline_dag_id: the id of the pipeline's txid DAG (default: the pipeline's name),
        which the declaration records.
    """

    ui_color = "#fdf3e1"
    template_fields: Sequence[str] = (PIPELINE_FIELD,)

    def __init__(
        self,
        *,
        txn_pipeline: TxnPipeline,
        chunk: int = FILL_CHUNK,
        poll_interval: float = FILL_POLL_INTERVAL,
        pipeline_dag_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.txn_pipeline = txn_pipeline
        self.pipeline_dag_id = pipeline_dag_id or txn_pipeline.name
        self.pipeline_name = txn_pipeline.name  # PIPELINE_FIELD
        self.chunk = chunk
        self.poll_interval = poll_interval
        self._stopped = threading.Event()
        self._session: SparkSession | None = None

    def execute(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        # at call time: at the top it adds to a DAG file's parse (the fill, the job and
        # the log's write side: 10 modules)
        from airflow_txn_provider.spark.fill import fill_pipeline

        p = self.txn_pipeline
        txlog = pipeline_log(p)
        declare_pipeline(txlog, p, self.pipeline_dag_id)
        with txlog.engine.connect() as conn:
            filling = sorted(filling_outputs(conn, p.name))
        if not filling:
            self.log.info("pipeline=%s: no output fills from history; waiting", p.name)
            self.defer(
                trigger=TxnFillDueTrigger(
                    txn_log_conn_id=p.txn_log_conn_id,
                    pipeline=p.name,
                    poll_interval=self.poll_interval,
                ),
                method_name="execute",
            )
        # The task's process lives on (a warmed, forked worker): it carries no session and no
        # Spark Connect mark into its next job, whatever this fill opened.
        with keep_classic_mode():
            try:
                report = fill_pipeline(
                    txlog,
                    p.name,
                    spark=self._open_session,
                    source=p.source,
                    transforms=self._transforms(),
                    sinks=p.sinks,
                    chunk=self.chunk,
                    on_progress=lambda line: self.log.info("pipeline=%s %s", p.name, line),
                    stopped=self._stopped.is_set,
                    expectations=p.expectations,
                )
            finally:
                if self._session is not None:
                    self._session.stop()
                    self._session = None
        return {
            "joined_after": report.joined_after,
            "computed": report.computed,
            "applied_staged": report.applied_staged,
            "rows": report.rows,
            "seconds": round(report.seconds, 1),
        }

    def _transforms(self) -> list[Transform]:
        # at call time: at the top it adds to a DAG file's parse (the runners, the job
        # and the log's write side: 9 modules)
        from airflow_txn_provider.operators.spark_runner import load_job_module

        return [cast("Transform", load_job_module(job).transform) for job in self.txn_pipeline.jobs]

    def _open_session(self) -> SparkSession:
        from pyspark.sql import SparkSession

        p = self.txn_pipeline
        if p.spark == "connect":
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            url = str(SparkConnectHook(p.spark_connect_conn_id).get_connection_url())
            # a session of its own (create, not getOrCreate: a classic session the process ran
            # must not refuse it); execute undoes the process's Connect marks after the fill
            self._session = SparkSession.builder.remote(url).create()
        else:
            # at call time: at the top they add to a DAG file's parse the Spark
            # provider's hook and the job and the log's write side (8 modules)
            from airflow_txn_provider.hooks.spark_submit import TxnSparkSubmitHook
            from airflow_txn_provider.spark.job import CONNECT_MODE_ENV

            master = TxnSparkSubmitHook(conn_id=p.spark_conn_id).master
            for name in CONNECT_MODE_ENV:  # a classic driver, whatever this process ran before
                os.environ.pop(name, None)
            builder = SparkSession.builder.master(master).appName(f"txn:{p.name}:fill")
            for key, value in p.spark_conf.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
        self.log.info("pipeline=%s: the fill's Spark session is on %s", p.name, p.spark)
        return self._session

    def on_kill(self) -> None:
        """Stop at the next step: the Spark work in flight is interrupted, the chunk it was
        computing is not applied (its transaction never began); the progress stays the log's."""
        self._stopped.set()
        session = self._session
        if session is not None:
            try:
                if self.txn_pipeline.spark == "connect":
                    session.interruptAll()
                else:
                    session.sparkContext.cancelAllJobs()
            except Exception as err:  # the task is going away anyway
                self.log.warning("could not interrupt the fill's Spark work: %s", err)


FILL_DAG_SUFFIX = "__fill"
"""The fill DAG's id: the pipeline DAG's, with this after it."""


__all__ = ["FILL_DAG_SUFFIX", "FILL_TASK_ID", "TxnFillOperator"]
