"""How long the run ahead's claim waits in its worker (no services: the log is a list of views)."""

from __future__ import annotations

import time
from contextlib import nullcontext

import pytest

from airflow_txn_provider import run_context
from airflow_txn_provider.rules.config import RUNS_AHEAD
from tests.unit.builders import FAIL, PROC, view


class Log:
    """The log as the claim's wait reads it: one view per look, the last one repeated."""

    engine = None

    def __init__(self, *views):
        self.views, self.looks = list(views), 0

    def view(self, pipeline):
        assert pipeline == "p"
        self.looks += 1
        return self.views[min(self.looks, len(self.views)) - 1]


FULL = view((4, 1, PROC), (5, 1, PROC), last=3, max_pending=2)
MOVED = view((5, 1, PROC), last=4, max_pending=2)  # txid 4 committed: 6 may begin
FAILED = view((4, 2, FAIL), (5, 1, FAIL), last=3, max_pending=2)  # the cascade: 4 replays first


class Changes:
    """The log's wake-ups as a poll: each wait a millisecond."""

    def __init__(self, engine, pipeline, *, fallback):
        assert engine is None and pipeline == "p" and fallback > 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def wait(self, timeout, *, ends_wait):
        assert callable(ends_wait)  # every wait says which changes end it (rules.waiting)
        time.sleep(min(timeout, 0.001)) if timeout > 0 else None
        return False


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(run_context, "PipelineChanges", Changes)
    monkeypatch.setattr(run_context, "ahead_wait_slot", lambda log: nullcontext("a slot"))


def test_the_run_ahead_begins_once_the_oldest_txid_commits(fast):
    log = Log(FULL, FULL, FULL, MOVED)
    assert run_context.window_moved(log, "p", 6, time.monotonic() + 5)
    assert log.looks == 4


def test_the_run_ahead_stops_waiting_when_a_txid_before_it_fails(fast):
    log = Log(FULL, FULL, FAILED)
    assert not run_context.window_moved(log, "p", 6, time.monotonic() + 5)
    assert log.looks == 3  # it defers: its wait may be long now


def test_a_txid_further_than_the_runs_ahead_does_not_wait_in_its_worker(fast):
    log = Log(FULL)
    assert not run_context.window_moved(log, "p", 6 + RUNS_AHEAD, time.monotonic() + 5)
    assert log.looks == 1


BEGUN_6 = view((5, 1, PROC), (6, 1, PROC), last=4, max_pending=2)  # 4 committed, 6 began
MOVED_7 = view((6, 1, PROC), last=5, max_pending=2)  # 5 committed: 7 may begin


def test_a_later_run_ahead_waits_for_the_begin_before_it_and_then_the_window(fast):
    # 6 is the first past the full window; 7 waits for 6 to begin, then for the next commit
    log = Log(FULL, FULL, BEGUN_6, BEGUN_6, MOVED_7)
    assert run_context.window_moved(log, "p", 7, time.monotonic() + 5)
    assert log.looks == 5


def test_a_run_ahead_takes_no_wait_of_the_begin_before_it_outside_its_slot(fast):
    # previous_began leaves a run ahead to window_moved (its wait slot bounds such waits)
    log = Log(FULL)
    assert not run_context.previous_began(log, "p", 7, time.monotonic() + 5)
    assert log.looks == 1


def test_the_run_ahead_waits_no_longer_than_its_deadline(fast):
    log = Log(FULL)
    started = time.monotonic()
    assert not run_context.window_moved(log, "p", 6, started + 0.05)
    assert 0.05 <= time.monotonic() - started < 2 and log.looks > 2


def test_with_every_wait_slot_taken_the_run_ahead_defers_at_once(fast, monkeypatch):
    monkeypatch.setattr(run_context, "ahead_wait_slot", lambda log: nullcontext(None))
    log = Log(FULL, MOVED)
    started = time.monotonic()
    assert not run_context.window_moved(log, "p", 6, started + 5)
    assert log.looks == 1 and time.monotonic() - started < 1


WAIT_SLOTS = [  # (how it is read, its environment variable, its default as the code reads it)
    pytest.param(run_context.ahead_waits, "RUN_AHEAD_WAITS", 4, id="run_ahead_waits"),
    pytest.param(run_context.commit_waits, "COMMIT_WAITS", 4, id="commit_waits"),
]


@pytest.mark.parametrize(("read", "env", "default"), WAIT_SLOTS)
@pytest.mark.parametrize("configured", [None, "0", "5"])
def test_the_wait_slots_come_from_the_provider_config(monkeypatch, read, env, default, configured):
    from airflow_txn_provider.get_provider_info import get_provider_info

    declared = get_provider_info()["config"]["txn_provider"]["options"]
    assert declared[env.lower()]["default"] == str(default)  # declared as the code reads it
    if configured is not None:
        monkeypatch.setenv(f"AIRFLOW__TXN_PROVIDER__{env}", configured)
    assert read() == (default if configured is None else int(configured))


@pytest.mark.parametrize(("read", "env", "default"), WAIT_SLOTS)
def test_a_negative_wait_slot_count_is_refused(monkeypatch, read, env, default):
    monkeypatch.setenv(f"AIRFLOW__TXN_PROVIDER__{env}", "-1")
    with pytest.raises(ValueError, match=f"{env.lower()} must be >= 0"):
        read()


# -- the run's claim: published by its claiming task, else the log's ----------------------------


def _claim_context(published):
    from types import SimpleNamespace

    ti = SimpleNamespace(xcom_pull=lambda task_ids, key: published)
    return {"ti": ti, "dag_run": SimpleNamespace(run_id="txid-000007", conf={})}


class ClaimLog:
    """The log as the commit task asks it for the attempt of a claim nobody published."""

    def __init__(self, info):
        self.info, self.asked = info, []

    def transaction(self, pipeline, txid):
        self.asked.append((pipeline, txid))
        return self.info


def test_a_published_claim_is_the_runs_claim_and_the_log_is_not_asked():
    published = {"txid": 7, "attempt": 2, "metadata": {"p": [0, 5]}}
    log = ClaimLog(None)
    got = run_context.claimed(_claim_context(published), "process_x", txlog=log, pipeline="p")
    assert got == published and log.asked == []


def test_an_unpublished_claim_is_the_attempt_the_log_holds_for_the_runs_txid():
    from types import SimpleNamespace

    log = ClaimLog(SimpleNamespace(attempt=3, metadata={"p": [5, 9]}))
    got = run_context.claimed(_claim_context(None), "process_x", txlog=log, pipeline="p")
    assert got == {"txid": 7, "attempt": 3, "metadata": {"p": [5, 9]}}
    assert log.asked == [("p", 7)]


def test_no_claim_anywhere_is_a_typed_failure_naming_the_claiming_task():
    from airflow_txn_provider.compat.airflow import AirflowFailException

    with pytest.raises(AirflowFailException, match="process_x recorded no claimed attempt"):
        run_context.claimed(_claim_context(None), "process_x", txlog=ClaimLog(None), pipeline="p")
    with pytest.raises(AirflowFailException, match="process_x"):  # no log given: XCom only
        run_context.claimed(_claim_context(None), "process_x")
