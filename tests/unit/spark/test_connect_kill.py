"""Stopping a Spark Connect run (issue 46), with a fake session: the run's operations carry a tag
of their own and a kill interrupts that tag only, only while the session is still the run's; a
stopped run, and a stopped processing task, report no failure of the attempt."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest

from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT
from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.operators import spark_runner
from airflow_txn_provider.operators.spark_runner import SparkConnectRunner, operation_tag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.run_context import fail_attempt_on_task_failure
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob, ProcessOutcome
from airflow_txn_provider.state import MapState

pytestmark = pytest.mark.skipif(not SUPPORTS_CONNECT, reason="Spark Connect: PySpark 4.0 and later")


class FakeSession:
    """What the runner calls on a Spark Connect session (PySpark's names), recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def addTag(self, tag: str) -> None:
        self.calls.append(("addTag", tag))

    def interruptTag(self, tag: str) -> list[str]:
        self.calls.append(("interruptTag", tag))
        return ["op-1"]

    def interruptAll(self) -> list[str]:
        self.calls.append(("interruptAll",))
        return ["op-1", "someone-elses-op"]


def _runner(monkeypatch, session, during=lambda runner: None):
    runner = SparkConnectRunner(lambda batch: batch, url="sc://127.0.0.1:1")

    @contextlib.contextmanager
    def fake_session(job, txlog):
        yield session, {"connect": 0.0}

    def fake_process_batch(spark, txlog, job, transform, **kwargs):
        during(runner)
        return ProcessOutcome(job, "stopped" if kwargs["stopped"]() else "processed")

    monkeypatch.setattr(runner, "_session", fake_session)
    monkeypatch.setattr(spark_runner, "process_batch", fake_process_batch)
    return runner


def test_a_kill_during_the_run_interrupts_its_own_tag_only(monkeypatch):
    session = FakeSession()
    runner = _runner(monkeypatch, session, during=lambda r: r.kill())
    outcome = runner.run(BatchJob("words", 7, 2, GeneratedTextSource()), txlog=None)
    (_, tag), interrupt = session.calls
    assert tag.startswith("txn-words-txid-7-attempt-2-")
    assert interrupt == ("interruptTag", tag)  # never interruptAll: the session is shared
    assert runner.stopped and outcome.status == "stopped"  # process_batch was told


def test_a_kill_after_the_run_interrupts_nothing(monkeypatch):
    session = FakeSession()
    runner = _runner(monkeypatch, session)
    runner.run(BatchJob("words", 7, 1, GeneratedTextSource()), txlog=None)
    runner.kill()  # its slot, and the session, may be the next txid's by now
    assert [c[0] for c in session.calls] == ["addTag"]


def test_a_kill_from_another_thread_waits_while_the_run_gives_its_session_up(monkeypatch):
    """The lease's thread kills while the run's thread clears its session: the kill sees either
    the run's session (and interrupts its tag) or none, never a session no longer the run's."""
    session = FakeSession()
    killed = threading.Event()

    def kill_while_holding(runner):
        with runner._guard:  # the run's thread is between two steps of giving it up
            threading.Thread(target=lambda: (runner.kill(), killed.set())).start()
            assert not killed.wait(0.3)  # the kill waits for the guard
            runner.session = runner._run = None
        assert killed.wait(5)

    runner = _runner(monkeypatch, session, during=kill_while_holding)
    runner.run(BatchJob("words", 1, 1, GeneratedTextSource()), txlog=None)
    assert [c[0] for c in session.calls] == ["addTag"]


def test_operation_tags_are_unique_per_run_and_valid():
    job = BatchJob("my.pipe-1", 3, 1, GeneratedTextSource())
    one, two = operation_tag(job), operation_tag(job)
    assert one != two  # two tries of one attempt never share a tag
    assert "," not in one and one.startswith("txn-my.pipe-1-txid-3-attempt-1-")


@pytest.fixture
def process_task():
    txn_pipeline = TxnPipeline(
        name="words",
        source=PartitionedParquetSource("/data/words"),
        jobs=["spark_jobs/word_count.py"],
        states=[MapState("words", "word_counts", keys={"word": "text"})],
    )
    return build_dag(txn_pipeline).get_task("process_word_count")


def test_the_operators_on_kill_stops_its_work_and_its_lease(process_task):
    calls = []
    process_task._lease = SimpleNamespace(abandon=lambda: calls.append("abandon"))
    process_task._runner = SimpleNamespace(kill=lambda: calls.append("kill"))
    process_task.on_kill()
    assert process_task.stopped and calls == ["abandon", "kill"]


@pytest.mark.parametrize(
    ("stopped", "held"),
    [(False, False), (True, False), (False, True)],
    ids=["published-claim", "stopped", "claim-held-in-this-process"],
)
def test_a_stopped_task_does_not_fail_its_attempt_from_its_failure_callback(
    process_task, monkeypatch, stopped, held
):
    from airflow_txn_provider import run_context
    from airflow_txn_provider.hooks import txn_log

    failed = []

    class FakeHook:
        def __init__(self, **kwargs):
            pass

        def get_log(self, migrate=True):
            return SimpleNamespace(fail=lambda *args, **kwargs: failed.append(args))

    monkeypatch.setattr(run_context, "claimed", lambda context, task_id: {"txid": 4, "attempt": 1})
    monkeypatch.setattr(txn_log, "TxnLogHook", FakeHook)
    process_task.stopped = stopped
    if held:  # its claim, unpublished: the callback fails that attempt, not XCom's
        process_task._lineage_claim = {"txid": 5, "attempt": 2}
    ti = SimpleNamespace(task_id=process_task.task_id, try_number=1)
    fail_attempt_on_task_failure({"ti": ti, "task": process_task})
    expected = [("words", 5, 2)] if held else [("words", 4, 1)]
    assert failed == ([] if stopped else expected)  # a later try resumed it
