"""The DAG builder's output: tasks, dependencies, window and its waker (the txid timetable and
its run ids: test_timetables.py)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.compat.airflow import DOUBLING_RETRY_BACKOFF

try:  # the serializer as the scheduler uses it (Airflow 3.1 names it SerializedDAG)
    from airflow.serialization.serialized_objects import DagSerialization
except ImportError:
    from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

from airflow_txn_provider.dag_builder import (
    COORDINATION_MAX_RETRY_DELAY,
    COORDINATION_RETRIES,
    build_dag,
)
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.config import RUNS_AHEAD
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState


def _pipeline(jobs=("spark_jobs/word_count.py",), **kw):
    kw.setdefault("states", [MapState("words", "word_counts", keys={"word": "text"})])
    return TxnPipeline(
        name="words", source=PartitionedParquetSource("/data/words"), jobs=jobs, **kw
    )


def _upstream(dag, task_id):
    return set(dag.get_task(task_id).upstream_task_ids)


def test_one_job_dag_shape():
    dag = build_dag(_pipeline(max_pending=3))
    # three tasks per txid: the processing task claims the txid itself
    assert set(dag.task_ids) == {"process_word_count", "commit", "watch_failures"}
    assert _upstream(dag, "process_word_count") == set()
    assert _upstream(dag, "watch_failures") == set()  # watches from the run's start
    assert _upstream(dag, "commit") == {"process_word_count"}
    # A processing task that recorded its output may fail to report it: the log decides.
    assert dag.get_task("commit").trigger_rule == "none_skipped"
    assert dag.max_active_runs == 3 + RUNS_AHEAD and not dag.catchup  # and the runs ahead
    process = dag.get_task("process_word_count")
    assert process.finish is True and process.claims is True
    assert {dag.get_task(t).claim_task_id for t in dag.task_ids} == {"process_word_count"}
    # Its retries cover the claim and a lost process; a processing failure raises
    # AirflowFailException (never retried: replays are new attempts, in order).
    coordination = [dag.get_task(t) for t in ("process_word_count", "commit", "watch_failures")]
    # enough tries, backing off, to outlast an api-server or database restart
    assert {t.retries for t in coordination} == {COORDINATION_RETRIES}
    assert all(t.retry_exponential_backoff == DOUBLING_RETRY_BACKOFF for t in coordination)
    assert all(t.max_retry_delay == COORDINATION_MAX_RETRY_DELAY for t in coordination)


def test_several_jobs_run_in_parallel_then_record_processed():
    dag = build_dag(_pipeline(jobs=("jobs/a.py", "jobs/b.py")))
    assert _upstream(dag, "process_a") == _upstream(dag, "process_b") == {"begin"}
    assert _upstream(dag, "processed") == {"process_a", "process_b"}
    assert _upstream(dag, "commit") == {"processed"}
    assert _upstream(dag, "watch_failures") == set()
    a = dag.get_task("process_a")
    assert a.finish is False and a.claims is False and a.claim_task_id == "begin"
    assert a.retries == 0  # it never claims: a failure is the failure sensor's to replay


@pytest.mark.parametrize("triggerer_start", [True, False])
def test_the_commit_and_the_watch_start_in_the_triggerer_unless_told_not_to(triggerer_start):
    from airflow.serialization.serialized_objects import BaseSerialization

    from airflow_txn_provider.compat.airflow import STARTS_FROM_TRIGGER
    from airflow_txn_provider.triggers.txn_log import FIRST_WATCHED, RUN_TXID

    triggerer_start = triggerer_start and STARTS_FROM_TRIGGER  # Airflow 3.1, 3.2: on workers
    built = build_dag(_pipeline(), triggerer_start=triggerer_start)
    # as the scheduler and the triggerer see it: from the serialized DAG
    dag = DagSerialization.from_dict(DagSerialization.to_dict(built))
    commit, watch = dag.get_task("commit"), dag.get_task("watch_failures")
    assert commit.start_from_trigger is watch.start_from_trigger is triggerer_start
    assert not dag.get_task("process_word_count").start_from_trigger
    if triggerer_start:
        kwargs = BaseSerialization.deserialize(watch.start_trigger_args.trigger_kwargs)
        assert (kwargs["txid"], kwargs["attempt"]) == (RUN_TXID, FIRST_WATCHED)
        assert kwargs["end_task_on_commit"] and watch.start_trigger_args.next_method == "on_failure"
        kwargs = BaseSerialization.deserialize(commit.start_trigger_args.trigger_kwargs)
        assert (kwargs["wait_for"], kwargs["end_task_on_commit"]) == ("committed", True)
        assert commit.start_trigger_args.next_method == "execute_complete"


def test_the_schedule_is_an_asset_whose_only_watcher_is_the_pipelines_waker():
    """Airflow runs the waker while the DAG is unpaused; it creates the txids' runs itself."""
    from airflow_txn_provider.triggers.waker import TxnWakerTrigger

    txn_pipeline = _pipeline(poll_interval=0.5, airflow_api_conn_id="api")
    built = build_dag(txn_pipeline, dag_id="words_dag")
    asset = built.timetable.asset_condition
    [watcher] = asset.watchers
    waker = watcher.trigger
    assert isinstance(waker, TxnWakerTrigger)
    path, kwargs = waker.serialize()
    assert path == "airflow_txn_provider.triggers.waker.TxnWakerTrigger"
    assert kwargs == {
        "txn_log_conn_id": txn_pipeline.txn_log_conn_id,
        "airflow_api_conn_id": "api",
        "pipeline": "words",
        "dag_id": "words_dag",
        "source": txn_pipeline.source.to_spec(),
        "poll_interval": 0.5,
    }
    assert TxnWakerTrigger(**kwargs).serialize() == (path, kwargs)  # as the triggerer rebuilds it
    # the scheduler's view: asset-triggered (never a run of its own: the asset gets no event),
    # the grid ordered by logical date, which encodes the txid
    dag = DagSerialization.from_dict(DagSerialization.to_dict(built))
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable"
    assert dag.timetable.run_ordering == ("logical_date",)


def test_a_pipeline_that_fills_from_history_gets_its_fill_dag():
    """One run at a time, continuous, unpaused at creation, its one task retried with backoff;
    registered by ``with DAG`` so a DAG file that assigns only the txid DAG still has it."""
    from airflow.sdk.definitions._internal.contextmanager import DagContext

    from airflow_txn_provider.operators.fill import TxnFillOperator

    later = MapState("words", "lengths", "transactional", keys={"n": "bigint"})
    txn_pipeline = _pipeline(
        states=[MapState("words", "words_counts", "transactional", keys={"word": "text"}), later],
        start={"lengths": "history"},
    )
    DagContext.autoregistered_dags.clear()
    # as a DagBag parses a DAG file: the DAGs a ``with DAG`` block makes in it are registered
    DagContext.current_autoregister_module_name = __name__
    try:
        dag = build_dag(txn_pipeline, dag_id="words_dag")
        registered = {d.dag_id: d for d, _ in DagContext.autoregistered_dags}
        DagContext.autoregistered_dags.clear()
        build_dag(_pipeline(), dag_id="plain")  # without a history start, no fill DAG
        plain = {d.dag_id for d, _ in DagContext.autoregistered_dags}
    finally:
        DagContext.current_autoregister_module_name = None
        DagContext.autoregistered_dags.clear()
    assert plain == {"plain"}
    fill = registered["words_dag__fill"]
    assert set(registered) == {"words_dag", "words_dag__fill"}
    assert fill.max_active_runs == 1 and fill.is_paused_upon_creation is False
    assert type(fill.timetable).__name__ == "ContinuousTimetable"
    [task] = fill.tasks
    assert isinstance(task, TxnFillOperator) and task.pipeline_dag_id == "words_dag"
    assert task.retries == COORDINATION_RETRIES
    assert {t.dag_id for t in dag.tasks} == {"words_dag"}


def test_the_pipeline_is_given_positionally_or_as_txn_pipeline_and_the_old_keyword_warns():
    from airflow.exceptions import AirflowProviderDeprecationWarning

    assert build_dag(txn_pipeline=_pipeline(), dag_id="a").dag_id == "a"
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"build_dag\(pipeline=\.\.\.\)"):
        old = build_dag(pipeline=_pipeline(), dag_id="b")  # the keyword before one meaning
    assert old.dag_id == "b" and "watch_failures" in old.task_ids
    with pytest.raises(TypeError, match="both txn_pipeline and pipeline"):
        build_dag(_pipeline(), pipeline=_pipeline(), dag_id="c")
    with pytest.raises(TypeError, match="takes a TxnPipeline, got str 'words'"):
        build_dag("words")  # type: ignore[arg-type]  # a pipeline's name is not its pipeline
    with pytest.raises(TypeError, match="takes a TxnPipeline, got NoneType"):
        build_dag(dag_id="d")
