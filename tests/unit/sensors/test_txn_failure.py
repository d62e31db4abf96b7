"""The failure sensor's rules: what it re-queues, what counts toward a poison batch, where a watch
starts; and the trigger ending a committed watch by itself (the failure-injection switch:
tests/unit/test_failure_injection.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from airflow_txn_provider.rules.coordinator import plan_failure
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import FailureResponse
from airflow_txn_provider.rules.waiting import (
    first_watched_attempt,
    known_failed_attempt,
    own_failures,
    requeue_set,
    respond_to_failure,
)
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from tests.unit.builders import DONE, FAIL, PROC, view


def failed(v: PipelineView, txid: int) -> PipelineView:
    """``v`` after the log failed ``txid`` and its cascade (what ``TransactionLog.fail`` writes)."""
    hit = set(plan_failure(v, txid))
    return replace(
        v,
        in_flight=tuple(
            replace(r, status=FAIL, failed_by=txid) if r.txid in hit else r for r in v.in_flight
        ),
    )


def test_requeue_set_is_the_failed_txid_and_every_later_one_in_flight():
    v = view((3, 1, DONE), (4, 1, PROC), (5, 2, DONE), (6, 1, PROC), last=2)
    after = failed(v, 4)
    assert requeue_set(after, 4) == (4, 5, 6)
    assert after.record(3).status is DONE  # an earlier txid keeps its output
    assert requeue_set(failed(v, 6), 6) == (6,)


def test_requeue_set_leaves_txids_failed_by_someone_else():
    v = failed(view((3, 1, DONE), (4, 1, PROC), (5, 1, PROC), last=2), 5)
    v = failed(v, 3)  # 3 then fails: 4 with it; 5 was failed by its own failure before
    assert requeue_set(v, 3) == (3, 4)
    assert v.record(5).failed_by == 5


def attempts(*outcomes: tuple[int | None, FailureResponse | None]) -> tuple[TxRecord, ...]:
    """Txid 7's history: one failed attempt per ``(failed_by, response)``, oldest first."""
    return tuple(
        TxRecord(txid=7, attempt=n, status=FAIL, failed_by=by, response=response)
        for n, (by, response) in enumerate(outcomes, start=1)
    )


R, L, S = FailureResponse.REQUEUE, FailureResponse.LEAVE_TO_ORIGIN, FailureResponse.STOP


@pytest.mark.parametrize(
    ("history", "max_attempts", "expected"),
    [
        (attempts((7, None)), 3, R),  # first own failure
        (attempts((7, R), (7, None)), 3, R),
        (attempts((7, R), (7, R), (7, None)), 3, S),  # third own failure: poison
        (attempts((7, None)), 1, S),  # no retries at all
        (attempts((7, R), (5, L), (7, None)), 3, R),  # a cascade in between does not count
        (attempts((7, R), (7, R), (5, None)), 3, L),  # a cascade never counts: 5 re-queues it
        (attempts((7, R), (7, S), (7, None)), 2, R),  # a person's rerun after a stop: new count
        (attempts((7, R), (7, S), (7, R), (7, None)), 2, S),
        (attempts((None, R), (None, R), (None, None)), 3, S),  # from before failed_by: its own
    ],
)
def test_respond_to_failure_counts_own_failures_from_the_log(history, max_attempts, expected):
    assert respond_to_failure(history, max_attempts) is expected


@pytest.mark.parametrize("answered", [R, L, S])
def test_a_failure_answered_already_keeps_its_answer(answered):
    """A retried failure sensor (its deferral lost in a crash) must not count a failure twice:
    the bug was a third attempt of a poison batch with max_attempts=2."""
    history = attempts((7, R), (7 if answered is not L else 5, answered))
    assert respond_to_failure(history, 2) is answered


def test_own_failures_restart_after_a_stop_and_skip_cascades():
    assert own_failures(()) == 0
    assert own_failures(attempts((7, R), (5, L), (None, R))) == 2
    assert own_failures(attempts((7, R), (7, S))) == 0
    assert own_failures(attempts((7, R), (7, S), (7, None))) == 1


def test_respond_to_failure_refuses_a_live_attempt():
    with pytest.raises(ValueError, match="has not failed"):
        respond_to_failure((TxRecord(txid=7, attempt=1, status=DONE),), 3)
    with pytest.raises(ValueError, match="no attempt"):
        respond_to_failure((), 3)


def test_a_watch_starts_after_failures_already_known():
    assert known_failed_attempt(view(last=2), 3) == 0  # not begun: attempt 1's failure counts
    assert known_failed_attempt(view((3, 2, PROC), last=2), 3) == 1  # attempt 2 is live
    assert known_failed_attempt(view((3, 2, FAIL), last=2), 3) == 2  # old news: begin re-emits


def test_a_watch_starting_with_its_run_counts_the_current_attempt_even_failed():
    assert first_watched_attempt(view(last=2), 3) == 0  # not claimed yet
    assert first_watched_attempt(view((3, 2, PROC), last=2), 3) == 1
    # its claim failed at once, before the watch started: still this run's failure to handle
    assert first_watched_attempt(view((3, 2, FAIL), last=2), 3) == 1


def _run_trigger_once(trigger, monkeypatch, v):
    """Run ``trigger`` against a fixed view instead of a database (a list: one view or error
    per poll, the last one repeated)."""
    polls = list(v) if isinstance(v, list) else [v]
    import sqlalchemy.ext.asyncio

    import airflow_txn_provider.hooks.txn_log as hooks

    class FakeConn:
        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

        async def run_sync(self, fn):
            item = polls.pop(0) if len(polls) > 1 else polls[0]
            if isinstance(item, Exception):
                raise item
            return item

    class FakeEngine:
        def connect(self):
            return FakeConn()

        async def dispose(self):
            pass

    async def url(self):
        return "postgresql+psycopg://x@127.0.0.1/x"

    monkeypatch.setattr(hooks.TxnLogHook, "async_sqlalchemy_url", url)
    monkeypatch.setattr(sqlalchemy.ext.asyncio, "create_async_engine", lambda *a, **k: FakeEngine())

    async def first():
        async for event in trigger.run():
            return event

    return asyncio.run(asyncio.wait_for(first(), 5))


def _outcome_trigger(end_task_on_commit):
    return TxnLogTrigger(
        txn_log_conn_id="c",
        pipeline="p",
        txid=3,
        attempt=0,
        wait_for=WaitFor.OUTCOME,
        end_task_on_commit=end_task_on_commit,
    )


def test_a_committed_watch_ends_its_task_in_the_triggerer(monkeypatch):
    event = _run_trigger_once(_outcome_trigger(True), monkeypatch, view(last=3))
    assert isinstance(event, TaskSuccessEvent)


def test_a_watch_with_nothing_to_answer_ends_skipped_which_costs_no_callback(monkeypatch):
    """Airflow parses the DAG file for every task that succeeds in the triggerer (to run its
    callbacks); a skipped one it does not. The run-start watch ends so when its txid commits."""
    from airflow.triggers.base import TaskSkippedEvent

    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.sensors.txn_failure import TxnFailureSensor
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.state import MapState

    txn_pipeline = TxnPipeline(
        name="p",
        source=PartitionedParquetSource("/d"),
        jobs=["j.py"],
        states=[MapState("p", "p_counts", keys={"word": "text"})],
    )
    # as on Airflow 3.3 (compat.airflow): 3.1 and 3.2 start the sensor on a worker
    monkeypatch.setattr("airflow_txn_provider.run_context.STARTS_FROM_TRIGGER", True)
    sensor = TxnFailureSensor(task_id="watch_failures", txn_pipeline=txn_pipeline)
    kwargs = sensor.start_trigger_args.trigger_kwargs
    assert kwargs["end_skipped"] is True and kwargs["end_task_on_commit"] is True
    quiet = TxnLogTrigger(**{**kwargs, "txid": 3, "attempt": 0})
    assert isinstance(_run_trigger_once(quiet, monkeypatch, view(last=3)), TaskSkippedEvent)
    # a watch that answered a failure ends successful: the grid shows the txid had one
    assert sensor._trigger(3, 2, requeue=True).end_skipped is False


def test_a_failure_resumes_the_task_with_the_failed_attempt(monkeypatch):
    v = failed(view((3, 2, PROC), last=2), 3)
    event = _run_trigger_once(_outcome_trigger(True), monkeypatch, v)
    assert type(event) is TriggerEvent
    assert event.payload == {"state": "failed", "attempt": 2, "txid": 3}


def test_without_end_task_on_commit_the_task_resumes(monkeypatch):
    event = _run_trigger_once(_outcome_trigger(False), monkeypatch, view(last=3))
    assert type(event) is TriggerEvent and event.payload["state"] == "committed"


def test_blocked_by_names_the_oldest_failed_txid_before():
    from airflow_txn_provider.rules.waiting import blocked_by

    v = failed(view((3, 1, DONE), (4, 1, PROC), (5, 1, PROC), (6, 1, PROC), last=2), 4)
    assert blocked_by(v, 6).txid == 4 and blocked_by(v, 4) is None
    assert blocked_by(view((3, 1, DONE), last=2), 4) is None


# -- started in the triggerer (start_from_trigger): txid and attempt read from the run ---------


def _started_trigger(wait_for, run_id, *, end_task_on_commit=True, attempt=0):
    from types import SimpleNamespace

    from airflow_txn_provider.triggers.txn_log import RUN_TXID

    trigger = TxnLogTrigger(
        txn_log_conn_id="c",
        pipeline="p",
        txid=RUN_TXID,
        attempt=attempt,
        wait_for=wait_for,
        end_task_on_commit=end_task_on_commit,
        poll_interval=0.01,
    )
    trigger.task_instance = SimpleNamespace(run_id=run_id, task_id="t")
    return trigger


def test_a_started_watch_reads_its_txid_from_the_run_and_watches_the_claimed_attempt(monkeypatch):
    from airflow_txn_provider.triggers.txn_log import FIRST_WATCHED

    # the claim failed at once (attempt 2), before the watch's first poll: its failure counts
    v = failed(view((3, 2, PROC), last=2), 3)
    watch = _started_trigger(WaitFor.OUTCOME, "txid-000003", attempt=FIRST_WATCHED)
    event = _run_trigger_once(watch, monkeypatch, v)
    assert event.payload == {"state": "failed", "attempt": 2, "txid": 3}
    committed = _started_trigger(WaitFor.OUTCOME, "txid-000003", attempt=FIRST_WATCHED)
    assert isinstance(_run_trigger_once(committed, monkeypatch, view(last=3)), TaskSuccessEvent)


def test_a_started_trigger_of_a_manual_run_hands_over_to_its_task(monkeypatch):
    trigger = _started_trigger(WaitFor.COMMITTED, "manual__2026-01-01T00:00:00+00:00")
    event = _run_trigger_once(trigger, monkeypatch, view(last=3))
    assert type(event) is TriggerEvent and event.payload == {"state": "manual_run"}


@pytest.mark.parametrize(
    ("v", "end_task_on_commit", "expected"),
    [
        (view(last=3), True, "success"),  # committed by its processing task: ends here
        (view(last=3), False, "committed"),  # it has Asset events to emit: on a worker
        (failed(view((3, 2, DONE), last=2), 3), True, "stale"),
    ],
)
def test_a_started_commit_ends_in_the_triggerer_or_wakes_its_task(
    monkeypatch, v, end_task_on_commit, expected
):
    trigger = _started_trigger(WaitFor.COMMITTED, "txid-000003", end_task_on_commit=True)
    trigger.end_task_on_commit = end_task_on_commit
    event = _run_trigger_once(trigger, monkeypatch, v)
    if expected == "success":
        assert isinstance(event, TaskSuccessEvent)
    else:
        assert type(event) is TriggerEvent and event.payload["state"] == expected
        assert event.payload["txid"] == 3


def test_a_started_commit_wakes_its_task_only_when_nobody_else_commits():
    from airflow_txn_provider.rules.waiting import awaits_commit
    from airflow_txn_provider.triggers.txn_log import READY_POLLS, evaluate

    ready = view((3, 1, DONE), last=2)
    waiting = view((2, 1, PROC), (3, 1, DONE), last=1)
    assert awaits_commit(ready, 3) and not awaits_commit(waiting, 3)
    assert not awaits_commit(view((3, 1, PROC), last=2), 3)
    assert evaluate(WaitFor.COMMITTED, ready, 3, 0, ready_polls=READY_POLLS - 1) is None
    assert evaluate(WaitFor.COMMITTED, ready, 3, 0, ready_polls=READY_POLLS).to_payload() == {
        "state": "open",
        "attempt": 1,
    }
    assert evaluate(WaitFor.COMMITTED, waiting, 3, 0, ready_polls=0) is None
    assert evaluate(WaitFor.COMMITTED, view((3, 1, PROC), last=2), 3, 0) is None


def test_a_started_watch_waits_for_the_pipelines_first_claim(monkeypatch):
    from airflow_txn_provider.rules.exceptions import UnknownPipelineError
    from airflow_txn_provider.triggers.txn_log import FIRST_WATCHED

    unknown = UnknownPipelineError("pipeline is not registered", pipeline="p")
    watch = _started_trigger(WaitFor.OUTCOME, "txid-000003", attempt=FIRST_WATCHED)
    polls = [unknown, unknown, failed(view((3, 1, PROC), last=2), 3)]
    event = _run_trigger_once(watch, monkeypatch, polls)
    assert event.payload == {"state": "failed", "attempt": 1, "txid": 3}


def test_a_watch_rides_out_an_unreachable_log_then_gives_up_at_its_deadline(monkeypatch):
    from sqlalchemy.exc import OperationalError

    down = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    watch = _started_trigger(WaitFor.OUTCOME, "txid-000003", attempt=1)
    event = _run_trigger_once(
        watch, monkeypatch, [down, down, failed(view((3, 2, PROC), last=2), 3)]
    )
    assert event.payload == {"state": "failed", "attempt": 2, "txid": 3}
    watch = _started_trigger(WaitFor.OUTCOME, "txid-000003", attempt=1)
    watch.outage_timeout = 0.0
    with pytest.raises(OperationalError):
        _run_trigger_once(watch, monkeypatch, [down])


def _stall_watch(txid: int, stall_alert_after: float | None = 10.0) -> TxnLogTrigger:
    return TxnLogTrigger(
        txn_log_conn_id="c",
        pipeline="p",
        txid=txid,
        attempt=1,
        wait_for=WaitFor.OUTCOME,
        stall_alert_after=stall_alert_after,
    )


def test_the_oldest_txids_watch_wakes_its_sensor_when_an_alert_is_due(monkeypatch):
    from airflow_txn_provider.log.alerts import Alert, AlertKind

    due = [Alert("p", AlertKind.STALLED, "after txid 2", 3, None, "pipeline=p stalled")]
    # a poll: the view, then (the oldest txid's watch) the alerts that are due
    event = _run_trigger_once(_stall_watch(3), monkeypatch, [view((3, 1, PROC), last=2), due])
    assert type(event) is TriggerEvent
    assert event.payload == {"state": "alert", "attempt": 1, "txid": 3}  # the watched attempt


def test_only_the_oldest_txids_watch_looks_for_due_alerts_every_few_seconds():
    import time

    from airflow_txn_provider.log.alerts import ALERT_CHECK_EVERY

    v = view((3, 1, PROC), (4, 1, PROC), last=2)
    assert _stall_watch(3)._may_alert(v, 3, 0.0)
    assert not _stall_watch(4)._may_alert(v, 4, 0.0)  # not the oldest uncommitted txid
    assert not _stall_watch(3)._may_alert(v, 3, time.monotonic())  # looked just now
    assert _stall_watch(3)._may_alert(v, 3, time.monotonic() - ALERT_CHECK_EVERY)
    assert not _stall_watch(3, None)._may_alert(v, 3, 0.0)  # no notifiers: never
    _path, kwargs = _stall_watch(3).serialize()
    assert kwargs["stall_alert_after"] == 10.0 and TxnLogTrigger(**kwargs).stall_alert_after == 10
