"""The operators against a real log: claims and deferral with the right trigger when the log says
to wait (no Airflow scheduler needed: the context is minimal; the commit task: test_commit.py)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from airflow_txn_provider.compat.airflow import (
    AirflowFailException,
    AirflowSkipException,
    TaskDeferred,
)
from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.operators import txn as txn_operators
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.vocabulary import FailureResponse
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from tests.conftest import set_txn_log_connection
from tests.spark_data import parquet_dataset, random_lines


def word_count_dag(name: str, tmp_path, *, seed: int, lines: int):
    """A word-count pipeline's DAG over ``lines`` lines, 10 a txid, two txids in flight."""
    source = PartitionedParquetSource(
        str(parquet_dataset(tmp_path / "ds", {"0": random_lines(seed, lines)})),
        max_per_partition=10,
    )
    txn_pipeline = TxnPipeline(
        name=name,
        source=source,
        jobs=["spark_jobs/word_count.py"],
        states=[MapState(name, f"{name}_words", keys={"word": "text"})],
        max_pending=2,
    )
    return build_dag(txn_pipeline)


@pytest.fixture
def dag(db_url, tmp_path, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    return word_count_dag("ops", tmp_path, seed=1, lines=20)


CLAIMER = "process_word_count"  # with one job, the processing task claims the txid


class FakeTI:
    """A task instance in the first try since its run started (``retry``: in Airflow's retry)."""

    def __init__(self, claim=None, retry=False):
        self.claim = claim
        self.max_tries = 100  # a clear raises it to try_number + retries
        self.try_number = self.max_tries + 1 - 12 + (1 if retry else 0)

    def xcom_pull(self, task_ids, key):
        assert (task_ids, key) == (CLAIMER, "claim")
        return self.claim

    def xcom_push(self, key, value):
        assert key == "claim"
        self.claim = value


def _context(txid, claim=None, dag=None, retry=False):
    return {
        "dag_run": SimpleNamespace(run_id=f"txid-{txid:06d}", conf={}),
        "ti": FakeTI(claim, retry=retry),
        "dag": dag,
    }


def test_the_claim_goes_in_order_and_defers_with_the_log_trigger(dag, monkeypatch):
    monkeypatch.setattr(txn_operators, "AHEAD_WAIT", 0.3)  # the run ahead's wait, then defer
    begin = dag.get_task(CLAIMER)
    with pytest.raises(TaskDeferred) as deferred:
        begin.execute(_context(2))  # txid 1 has not begun: wait, deferred (before any Spark)
    trigger = deferred.value.trigger
    assert isinstance(trigger, TxnLogTrigger)
    assert (trigger.wait_for, trigger.txid, trigger.pipeline) == (WaitFor.CAN_BEGIN, 2, "ops")
    assert deferred.value.method_name == "execute"

    ctx = _context(1)
    claim = begin.claim(ctx)
    assert claim == {"txid": 1, "attempt": 1, "metadata": {"0": [0, 10]}}
    assert ctx["ti"].claim == claim  # for the run's other tasks
    assert begin.claim(_context(2))["metadata"] == {"0": [10, 20]}
    started = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        begin.claim(_context(3))  # window of 2 is full: the run ahead waits, then defers
    assert deferred.value.trigger.wait_for is WaitFor.CAN_BEGIN
    assert time.monotonic() - started >= 0.3


def test_the_run_ahead_begins_in_its_worker_once_the_oldest_txid_commits(
    db_url, tmp_path, monkeypatch
):
    """Txid 3's claim, past a full window of two, waits in its process (no deferral) and begins
    as soon as txid 1 commits, from where txid 2 ended."""
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    dag = word_count_dag("ahead", tmp_path, seed=2, lines=30)
    begin, commit = dag.get_task(CLAIMER), dag.get_task("commit")
    one = begin.claim(_context(1))
    begin.claim(_context(2))
    txlog = begin.txlog()

    def commit_txid_1() -> None:
        time.sleep(1.0)
        txlog.mark_processed("ahead", 1, one["attempt"], {})
        commit.execute(_context(1, one))

    committer = threading.Thread(target=commit_txid_1)
    started = time.monotonic()
    committer.start()
    three = begin.claim(_context(3))  # no TaskDeferred: it waited in this process
    waited = time.monotonic() - started
    committer.join()
    assert three == {"txid": 3, "attempt": 1, "metadata": {"0": [20, 30]}}
    assert 1.0 <= waited < txn_operators.AHEAD_WAIT
    assert txlog.view("ahead").last_committed == 1


def test_an_airflow_retry_of_a_claim_never_replays_a_failed_attempt(dag):
    """Only the failure sensor (or a person) restarts a failed txid: a retry of the claiming task
    (its failure not reported, so Airflow retried it) adding an attempt would go behind the
    sensor's poison-batch count (CI: a third attempt of a poison batch, max_attempts=2)."""
    begin = dag.get_task(CLAIMER)
    assert begin.retries == 12  # FakeTI's first try assumes it
    txlog = begin.txlog()
    first = begin.claim(_context(1))
    assert begin.claim(_context(1, retry=True)) == first  # a live attempt: resumed, as before
    txlog.fail("ops", 1, 1, error="boom")
    with pytest.raises(AirflowFailException) as refused:
        begin.claim(_context(1, retry=True))
    message = str(refused.value)
    assert "pipeline=ops txid=1 attempt=1 failed (boom)" in message
    assert "failure sensor re-queues" in message
    assert [a.attempt for a in txlog.history("ops", 1)] == [1]  # nothing added
    # the sensor's restart (a clear: a first try again) replays it
    assert begin.claim(_context(1))["attempt"] == 2


def test_manual_run_is_refused_clearly(dag):
    from airflow_txn_provider.compat.airflow import AirflowFailException

    ctx = {"dag_run": SimpleNamespace(run_id="manual__2026-11-21"), "ti": FakeTI()}
    with pytest.raises(AirflowFailException, match="not a transaction"):
        dag.get_task(CLAIMER).execute(ctx)


def test_manual_run_names_its_txid_in_conf(dag):
    ctx = {"dag_run": SimpleNamespace(run_id="manual__x", conf={"txid": 1}), "ti": FakeTI()}
    assert dag.get_task(CLAIMER).claim(ctx)["txid"] == 1


class ClearRecorder:
    calls: list = []

    def __init__(self, conn_id):
        self.conn_id = conn_id

    def clear_task_instances(self, dag_id, task_ids, run_id=None, logical_dates=None, note=None):
        from airflow_txn_provider.timetables import txid_of_logical_date

        first, last = (txid_of_logical_date(d) for d in logical_dates)
        ClearRecorder.calls.append(
            (self.conn_id, dag_id, (first, last), sorted(task_ids), run_id, note)
        )
        return sorted(task_ids)

    def set_run_note(self, dag_id, run_id, note):
        ClearRecorder.notes.append((dag_id, run_id, note))

    def task_instances(self, dag_id, run_id):
        return [{"task_id": "commit", "state": "failed"}]  # settled


@pytest.fixture
def clears(monkeypatch):
    import airflow_txn_provider.operators.run_retention as run_retention
    import airflow_txn_provider.sensors.txn_failure as sensor
    import airflow_txn_provider.triggers.waker as waker

    ClearRecorder.calls = []
    ClearRecorder.notes = []
    for module in (sensor, run_retention, waker):  # where the REST API's hook is looked up
        monkeypatch.setattr(module, "AirflowApiHook", ClearRecorder)
    return ClearRecorder.calls


def test_failure_sensor_restarts_its_run_then_stops_a_poison_batch(dag, clears):
    begin, watch = dag.get_task(CLAIMER), dag.get_task("watch_failures")
    txlog = begin.txlog()
    ctx = _context(1, begin.claim(_context(1)), dag=dag)
    begin.claim(_context(2))
    txlog.fail("ops", 1, 1, error="boom")  # fails txid 2 with it
    with pytest.raises(TaskDeferred) as deferred:
        watch.execute(ctx)  # starting after its claim failed at once: that failure is to handle
    assert deferred.value.trigger.wait_for is WaitFor.OUTCOME
    assert deferred.value.trigger.end_task_on_commit
    assert deferred.value.trigger.attempt == 0  # wakes on the failure of attempt 1
    with pytest.raises(TaskDeferred) as deferred:
        watch.on_failure(ctx, {"state": "failed", "attempt": 1, "txid": 1})
    assert deferred.value.trigger.attempt == 1  # next wake: a newer attempt's outcome
    assert txlog.history("ops", 1)[-1].response is FailureResponse.REQUEUE  # answered, in the log
    # one request re-queues the whole cascade: the runs of txids 1 and 2, by logical date
    (conn_id, dag_id, txids, tasks, run_id, note) = clears[-1]
    assert (conn_id, dag_id, txids, run_id) == ("airflow_api_default", "ops", (1, 2), None)
    assert "watch_failures" not in tasks and {CLAIMER, "commit"} <= set(tasks)
    assert "attempt 1 failed (its own failure); re-queued txids 1..2" in note
    assert deferred.value.trigger.requeue_timeout is not None  # a lost re-queue is noticed

    # txid 2 failed in the cascade: its sensor leaves the re-queue to txid 1's and keeps watching
    with pytest.raises(TaskDeferred) as deferred:
        watch.on_failure(_context(2, dag=dag), {"state": "failed", "txid": 2})
    assert deferred.value.trigger.requeue_timeout is not None
    assert len(clears) == 1

    # Airflow retries txid 1's sensor (its deferral was lost in a crash): the retry finds the
    # failure answered in the log, so it neither restarts the runs again nor counts it again
    with pytest.raises(TaskDeferred) as deferred:
        watch.execute(ctx)
    with pytest.raises(TaskDeferred) as deferred:
        watch.on_failure(ctx, {"state": "failed", "attempt": 1, "txid": 1})
    assert len(clears) == 1 and deferred.value.trigger.requeue_timeout is not None

    # ... unless that re-queue never came: then it restarts its own run, alone
    with pytest.raises(TaskDeferred):
        watch.on_failure(_context(2, dag=dag), {"state": "not_requeued", "attempt": 1, "txid": 2})
    (_, _, txids, _, _, note) = clears[-1]
    assert txids == (2, 2) and "txid 1's failure" in note

    begin.claim(_context(1))  # attempt 2, fails again: max_attempts=3 allows one more
    txlog.fail("ops", 1, 2, error="boom again")
    with pytest.raises(TaskDeferred):
        watch.on_failure(ctx, {"state": "failed", "txid": 1})
    begin.claim(_context(1))
    txlog.fail("ops", 1, 3, error="still broken")
    with pytest.raises(TaskDeferred) as stop:
        watch.on_failure(ctx, {"state": "failed", "txid": 1})
    # a poison batch: the run is not restarted; it stays (keeping its slot) with a note saying why
    assert len(clears) == 4
    assert clears[-1][2] == (2, 2)  # the later runs wait for it, re-queued
    ((dag_id, run_id, note),) = ClearRecorder.notes
    assert (dag_id, run_id) == ("ops", "txid-000001")
    assert "txid=1 attempt=3: POISON BATCH" in note and "failed 3 times" in note
    assert "still broken" in note and "Clear this run" in note
    assert stop.value.trigger.attempt == 3  # a new attempt (a rerun) is still watched
    assert txlog.history("ops", 1)[-1].response is FailureResponse.STOP
    # a retry of the stopped sensor keeps watching, says nothing twice, restarts nothing
    with pytest.raises(TaskDeferred):
        watch.on_failure(ctx, {"state": "failed", "txid": 1})
    assert len(clears) == 4 and len(ClearRecorder.notes) == 1

    # a person fixes the cause and clears the run: the rerun has a fresh max_attempts
    begin.claim(_context(1))
    txlog.fail("ops", 1, 4, error="one more")
    with pytest.raises(TaskDeferred):
        watch.on_failure(ctx, {"state": "failed", "txid": 1})
    assert txlog.history("ops", 1)[-1].response is FailureResponse.REQUEUE


def test_failure_sensor_skips_manual_runs(dag):
    ctx = {"dag_run": SimpleNamespace(run_id="manual__x", conf={"txid": 1}), "ti": FakeTI()}
    with pytest.raises(AirflowSkipException, match="manual run"):
        dag.get_task("watch_failures").execute(ctx)


def test_a_requeue_waits_for_the_failed_runs_to_settle(dag, clears, monkeypatch):
    """The clear comes only once no task of a failed run is running or deferred: clearing a task
    instance that Airflow's scheduler or triggerer is updating kills that component."""
    import airflow_txn_provider.sensors.txn_failure as txn

    polls = []

    def task_instances(self, dag_id, run_id):
        polls.append((run_id, len(clears)))
        busy = sum(1 for r, _ in polls if r == run_id) <= 2  # busy on the first two looks
        return [{"task_id": "commit", "state": "deferred" if busy else "failed"}]

    monkeypatch.setattr(ClearRecorder, "task_instances", task_instances)
    monkeypatch.setattr(txn.time, "sleep", lambda s: None)
    begin, watch = dag.get_task(CLAIMER), dag.get_task("watch_failures")
    ctx = _context(1, begin.claim(_context(1)), dag=dag)
    begin.claim(_context(2))
    begin.txlog().fail("ops", 1, 1, error="boom")
    with pytest.raises(TaskDeferred):
        watch.on_failure(ctx, {"state": "failed", "attempt": 1, "txid": 1})
    assert {r for r, _ in polls} == {"txid-000001", "txid-000002"}  # both failed runs looked at
    assert all(n == 0 for _, n in polls), "cleared before the runs settled"
    assert len(clears) == 1 and clears[0][2] == (1, 2)


def test_a_requeue_skips_a_run_restarted_while_it_settled(dag, clears, monkeypatch):
    """A lost re-queue's fallback restarts the run only if the txid is still failed once the run
    settled: the late re-queue it waited for may have restarted it meanwhile, and a second clear
    would then add an attempt nobody asked for (counted toward a poison batch)."""
    import airflow_txn_provider.sensors.txn_failure as txn

    begin, watch = dag.get_task(CLAIMER), dag.get_task("watch_failures")
    ctx = _context(1, begin.claim(_context(1)), dag=dag)
    begin.txlog().fail("ops", 1, 1, error="boom")
    looks = []

    def task_instances(self, dag_id, run_id):
        looks.append(run_id)
        if len(looks) == 1:  # the late re-queue arrived: the run is starting, it claims again
            begin.claim(_context(1))
            return [{"task_id": CLAIMER, "state": "running"}]
        return [{"task_id": CLAIMER, "state": "failed"}]

    monkeypatch.setattr(ClearRecorder, "task_instances", task_instances)
    monkeypatch.setattr(txn.time, "sleep", lambda s: None)
    with pytest.raises(TaskDeferred):
        watch.on_failure(ctx, {"state": "not_requeued", "attempt": 1, "txid": 1})
    assert len(looks) == 2 and clears == []
    assert [a.attempt for a in begin.txlog().history("ops", 1)] == [1, 2]


def test_the_claim_records_the_dag_that_runs_the_pipeline(dag):
    """The Transactions page authorises a pipeline by the DAG that runs it, as the claim records
    it, and registers the pipeline once per declaration (a second claim reads, writes nothing)."""
    begin = dag.get_task(CLAIMER)
    begin.claim(_context(1))
    txlog = begin.txlog()
    assert (
        txlog.ensure_pipeline(
            "ops",
            source_kind="transactional",
            max_pending=2,
            dag_id=dag.dag_id,
            states=begin.txn_pipeline.states,
        )
        is False
    )
    assert (
        txlog.ensure_pipeline(
            "ops",
            source_kind="transactional",
            max_pending=3,
            dag_id=dag.dag_id,
            states=begin.txn_pipeline.states,
        )
        is True
    )  # a new declaration registers again
    assert begin.txlog().pipeline_dags() == {"ops": {dag.dag_id}}
