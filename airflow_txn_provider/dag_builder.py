"""Build a transaction DAG from a :class:`~airflow_txn_provider.pipeline.TxnPipeline`.

One run per txid, in txid order (its logical date encodes the txid), made by the pipeline's waker
(:mod:`airflow_txn_provider.triggers.waker`) once the window has room and the source has data, so
an idle pipeline holds no run; ``max_active_runs`` is the window plus ``RUNS_AHEAD``. Per run
(``commit`` and ``watch_failures`` start in the triggerer: docs/airflow.md, "Tasks of a txid")::

    process_<job> >> commit                                  (one job: it claims the txid itself)
    begin >> [process_<job> ...] >> processed >> commit      (several jobs, in parallel)
    watch_failures                           (the failure sensor, beside the work from the start)

A pipeline that fills an output from history also gets ``<dag_id>__fill`` (:func:`build_fill_dag`).
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_txn_provider.compat.airflow import DOUBLING_RETRY_BACKOFF
from airflow_txn_provider.operators.commit import TxnCommitOperator, TxnRecordProcessedOperator
from airflow_txn_provider.operators.fill import FILL_DAG_SUFFIX, FILL_TASK_ID, TxnFillOperator
from airflow_txn_provider.operators.txn import TxnBeginOperator, TxnProcessOperator, job_task_id
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.config import RUNS_AHEAD
from airflow_txn_provider.rules.vocabulary import OutputStart
from airflow_txn_provider.run_context import (
    BEGIN_TASK_ID,
    COMMIT_TASK_ID,
    WATCH_TASK_ID,
    fail_attempt_on_task_failure,
)
from airflow_txn_provider.sensors.txn_failure import TxnFailureSensor
from airflow_txn_provider.timetables import TXID_EPOCH
from airflow_txn_provider.triggers.waker import TxnWakerTrigger

# Begin, gate, commit and the failure sensor are safe to run again (claims and commits are fenced
# and idempotent), so Airflow may retry them: a lost database connection, and Airflow 3.3's race
# that fails a deferred task resumed within seconds of deferring (a stale executor event from the
# deferring process: apache/airflow#71580, #72716), then cost a retry, not a stuck pipeline.
# Processing is not retried by Airflow: a failed attempt is the failure sensor's to replay, with
# a new attempt, in order (a task that claims and processes is retried only for its claim and for
# a lost process: see build_dag).
COORDINATION_RETRIES = 12
"""With a backoff doubling from 2 s up to ``COORDINATION_MAX_RETRY_DELAY``: about five minutes of
tries, so an api-server or database restart (tasks cannot even start while the execution API is
away) never exhausts them. A failure sensor that gave up would leave its txid unwatched."""
COORDINATION_MAX_RETRY_DELAY = timedelta(seconds=30)


def build_dag(
    txn_pipeline: TxnPipeline | None = None,
    *,
    dag_id: str | None = None,
    triggerer_start: bool = True,
    **dag_kwargs: Any,
) -> DAG:
    """The DAG of ``txn_pipeline``; extra keyword arguments go to ``DAG`` (tags, doc_md, …).

    :param txn_pipeline: the pipeline (its keyword was ``pipeline``: still taken, with a
        deprecation warning; ``pipeline`` is a pipeline's name everywhere else).
    :param triggerer_start: start ``commit`` and ``watch_failures`` in the triggerer (Airflow's
        ``start_from_trigger``): a txid that commits without failing starts one worker task, its
        processing. ``False``: they start on a worker, then defer.
    """
    txn_pipeline = _the_pipeline(txn_pipeline, dag_kwargs.pop("pipeline", None))
    # retry_delay also paces a task that the failure sensor cleared while it was still finishing
    # (Airflow then puts it up for retry): seconds, not the default five minutes.
    default_args = {
        "retries": 0,
        "retry_delay": timedelta(seconds=2),
        **dag_kwargs.pop("default_args", {}),
    }
    dag_kwargs.setdefault("tags", ["transactions"])
    dag_kwargs.setdefault("dagrun_timeout", None)
    dag_id = dag_id or txn_pipeline.name
    with DAG(
        dag_id=dag_id,
        schedule=waker_asset(txn_pipeline, dag_id),
        start_date=TXID_EPOCH,
        catchup=False,
        # RUNS_AHEAD runs more than the window: the txids just past a full window may have
        # their runs already, waiting in their workers to begin (waiting.runs_ahead).
        max_active_runs=txn_pipeline.window_bound + RUNS_AHEAD,
        max_consecutive_failed_dag_runs=0,
        default_args=default_args,
        **dag_kwargs,
    ) as dag:
        coordination: dict[str, Any] = {
            "retries": COORDINATION_RETRIES,
            "retry_exponential_backoff": DOUBLING_RETRY_BACKOFF,
            "max_retry_delay": COORDINATION_MAX_RETRY_DELAY,
        }
        single = len(txn_pipeline.jobs) == 1
        claim_task_id = job_task_id(str(txn_pipeline.jobs[0])) if single else BEGIN_TASK_ID
        common: dict[str, Any] = {"txn_pipeline": txn_pipeline, "claim_task_id": claim_task_id}
        jobs = [
            TxnProcessOperator(
                task_id=job_task_id(str(job)),
                job=str(job),
                finish=single,
                claim=single,
                execution_timeout=timedelta(hours=6),
                on_failure_callback=fail_attempt_on_task_failure,
                # A task that claims is retried like the coordination tasks (its claim may meet
                # an outage, its process may be lost): a retry resumes the attempt it claimed.
                # A failure of the processing itself is never retried by Airflow (it raises
                # AirflowFailException): the failure sensor replays the txid, in order.
                **(coordination if single else {}),
                **common,
            )
            for job in txn_pipeline.jobs
        ]
        commit = TxnCommitOperator(
            task_id=COMMIT_TASK_ID, triggerer_start=triggerer_start, **coordination, **common
        )
        if single:
            jobs[0] >> commit
        else:
            begin = TxnBeginOperator(task_id=BEGIN_TASK_ID, **coordination, **common)
            processed = TxnRecordProcessedOperator(task_id="processed", **coordination, **common)
            begin >> jobs >> processed >> commit
        TxnFailureSensor(
            task_id=WATCH_TASK_ID, triggerer_start=triggerer_start, **coordination, **common
        )
    if OutputStart.HISTORY in txn_pipeline.start.values():
        build_fill_dag(txn_pipeline, dag_id=dag_id, tags=dag_kwargs.get("tags"))
    return dag


def _the_pipeline(txn_pipeline: Any, old_keyword: Any) -> TxnPipeline:
    """``build_dag``'s pipeline, given positionally, as ``txn_pipeline=``, or (deprecated) as
    ``pipeline=``; a clear error for anything else."""
    if old_keyword is not None:
        if txn_pipeline is not None:
            raise TypeError("build_dag() got both txn_pipeline and pipeline: give txn_pipeline")
        warnings.warn(
            "build_dag(pipeline=...) is deprecated: give the TxnPipeline positionally or as "
            "txn_pipeline=... (pipeline means a pipeline's name everywhere else)",
            AirflowProviderDeprecationWarning,
            stacklevel=3,
        )
        txn_pipeline = old_keyword
    if not isinstance(txn_pipeline, TxnPipeline):
        raise TypeError(
            f"build_dag() takes a TxnPipeline, got {type(txn_pipeline).__name__} "
            f"{txn_pipeline!r:.80}: build_dag(TxnPipeline(name=..., source=..., jobs=...))"
        )
    return txn_pipeline


def build_fill_dag(
    txn_pipeline: TxnPipeline, *, dag_id: str | None = None, tags: Any = None
) -> DAG:
    """The fill DAG of ``txn_pipeline`` (whose txid DAG is ``dag_id``): ``<dag_id>__fill``, run
    continuously one run at a time, unpaused at creation (the declaration asked for the fill).
    Its task waits in the triggerer while nothing fills; killed or failed, it is retried with
    backoff and resumes from the log. :func:`build_dag` builds it whenever the pipeline declares
    an output with ``start="history"``; Airflow finds it through ``with DAG``'s registration."""
    dag_id = dag_id or txn_pipeline.name
    with DAG(
        dag_id=f"{dag_id}{FILL_DAG_SUFFIX}",
        schedule="@continuous",
        start_date=TXID_EPOCH,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        dagrun_timeout=None,
        tags=list(tags or ["transactions"]),
        doc_md=f"Fills the outputs of pipeline `{txn_pipeline.name}` declared "
        '`start="history"` from its committed txids, beside its live DAG `' + dag_id + "`.",
    ) as dag:
        TxnFillOperator(
            task_id=FILL_TASK_ID,
            txn_pipeline=txn_pipeline,
            pipeline_dag_id=dag_id,
            chunk=txn_pipeline.fill_chunk,
            retries=COORDINATION_RETRIES,
            retry_exponential_backoff=DOUBLING_RETRY_BACKOFF,
            max_retry_delay=COORDINATION_MAX_RETRY_DELAY,
            retry_delay=timedelta(seconds=2),
        )
    return dag


def waker_asset(txn_pipeline: TxnPipeline, dag_id: str) -> Asset:
    """The asset a pipeline's DAG is scheduled on: it only carries the pipeline's waker (Airflow
    runs an ``AssetWatcher``'s trigger while its DAG is unpaused). The waker never fires an event,
    so the asset gets none and the DAG no asset-triggered run: its runs are the txids' own."""
    waker = TxnWakerTrigger(
        txn_log_conn_id=txn_pipeline.txn_log_conn_id,
        airflow_api_conn_id=txn_pipeline.airflow_api_conn_id,
        pipeline=txn_pipeline.name,
        dag_id=dag_id,
        source=txn_pipeline.source.to_spec(),
        poll_interval=txn_pipeline.poll_interval,
    )
    return Asset(
        name=f"txn:{dag_id}:due",
        uri=f"txn-waker://{dag_id}",
        group="txn",
        watchers=[AssetWatcher(name=f"{dag_id}_waker", trigger=waker)],
    )
