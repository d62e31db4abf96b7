"""The begin and commit-gate operators against a real log: claims, and deferral with the right
trigger when the log says to wait (no Airflow scheduler needed: the context is minimal)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.spark.sources import PartitionedParquetSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from tests.conftest import set_txn_log_connection
from tests.spark_data import parquet_dataset, random_lines


@pytest.fixture
def dag(db_url, tmp_path, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    source = PartitionedParquetSource(
        str(parquet_dataset(tmp_path / "ds", {"0": random_lines(1, 20)})), max_per_partition=10
    )
    pipeline = TxnPipeline(
        name="ops",
        source=source,
        jobs=["spark_jobs/word_count.py"],
        states=[MapState("ops", "ops_words", keys={"word": "text"})],
        max_pending=2,
    )
    return build_dag(pipeline)


class FakeTI:
    def __init__(self, claim=None):
        self.claim = claim

    def xcom_pull(self, task_ids):
        return self.claim


def _context(txid, claim=None):
    return {"dag_run": SimpleNamespace(run_id=f"txid-{txid:06d}"), "ti": FakeTI(claim)}


def test_begin_claims_in_order_and_defers_with_the_log_trigger(dag):
    begin = dag.get_task("begin")
    with pytest.raises(TaskDeferred) as deferred:
        begin.execute(_context(2))  # txid 1 has not begun: wait, deferred
    trigger = deferred.value.trigger
    assert isinstance(trigger, TxnLogTrigger)
    assert (trigger.wait_for, trigger.txid, trigger.pipeline) == (WaitFor.CAN_BEGIN, 2, "ops")
    assert deferred.value.method_name == "execute"

    claim = begin.execute(_context(1))
    assert claim == {"txid": 1, "attempt": 1, "metadata": {"0": [0, 10]}}
    assert begin.execute(_context(2))["metadata"] == {"0": [10, 20]}
    with pytest.raises(TaskDeferred) as deferred:
        begin.execute(_context(3))  # window of 2 is full
    assert deferred.value.trigger.wait_for is WaitFor.CAN_BEGIN


def test_commit_gate_waits_for_previous_then_commit_is_idempotent(dag):
    begin, gate, commit = (dag.get_task(t) for t in ("begin", "commit_gate", "commit"))
    one = begin.execute(_context(1))
    two = begin.execute(_context(2))
    with pytest.raises(TaskDeferred) as deferred:
        gate.execute(_context(2, two))
    assert deferred.value.trigger.wait_for is WaitFor.COMMIT_GATE
    assert deferred.value.trigger.attempt == two["attempt"]
    log = begin.txn_log()
    log.mark_processed("ops", 1, 1, {})
    assert gate.execute(_context(1, one)) == "open"
    assert commit.execute(_context(1, one)) == {"applied": True, "committed_attempt": 1}
    assert commit.execute(_context(1, one))["applied"] is False  # a duplicate run: no-op
    with pytest.raises(AirflowSkipException):
        begin.execute(_context(1))  # rerun of a committed txid's run does nothing


def test_manual_run_is_refused_clearly(dag):
    from airflow.sdk.exceptions import AirflowFailException

    ctx = {"dag_run": SimpleNamespace(run_id="manual__2026-11-21"), "ti": FakeTI()}
    with pytest.raises(AirflowFailException, match="not a transaction"):
        dag.get_task("begin").execute(ctx)
