"""The run ahead's wait in its worker, on a real Postgres log: it begins the moment the oldest txid
commits (woken by the log's notification, not a poll), and at most ``[txn_provider]
run_ahead_waits`` such waits hold worker slots at once, all pipelines of the log together
(advisory locks: a holder that dies frees its slot). The wake-ups themselves
(:mod:`airflow_txn_provider.log.changes`): a write notifies its pipeline's listeners at its
commit, never at a rollback, and never another pipeline's."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from airflow_txn_provider import run_context
from airflow_txn_provider.log import changes
from airflow_txn_provider.log.advisory import held_count
from airflow_txn_provider.log.changes import PipelineChanges
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import BeginAction
from tests.conftest import wait_until


class Tens(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"start": (prev or {"end": 0})["end"], "end": txid * 10}


def _full_window(txlog, pipeline: str) -> None:
    """Txids 1 and 2 processing in a window of 2: txid 3 is the run ahead."""
    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    for txid in (1, 2):
        assert txlog.begin(pipeline, txid, Tens()).emitted
    assert txlog.begin(pipeline, 3, Tens()).action is BeginAction.WAIT_WINDOW


def _wait_slots_held(engine) -> int:
    return held_count(engine, run_context._AHEAD_LOCK_CLASS)


@pytest.fixture
def one_wait_slot(monkeypatch):
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__RUN_AHEAD_WAITS", "1")
    # a wait a poll would end takes 30 s: one that ends sooner was woken by the log
    monkeypatch.setattr(changes, "RECHECK", 30.0)
    monkeypatch.setattr(run_context, "AHEAD_POLL", 30.0)


def test_a_run_ahead_waits_for_the_commit_and_a_second_finds_no_slot(txlog, one_wait_slot):
    for pipeline in ("p", "q"):
        _full_window(txlog, pipeline)
    assert run_context.ahead_wait_slots_free(txlog) == 1
    moved: list[bool] = []
    waiter = threading.Thread(
        target=lambda: moved.append(run_context.window_moved(txlog, "p", 3, time.monotonic() + 30))
    )
    waiter.start()
    wait_until(lambda: _wait_slots_held(txlog.engine) == 1, 10, "p's run ahead to hold a slot")

    # A claim now creates no run ahead (it would defer), and another pipeline's run ahead (one
    # created before) finds the log's one slot taken, so it defers at once.
    assert run_context.ahead_wait_slots_free(txlog) == 0
    started = time.monotonic()
    assert not run_context.window_moved(txlog, "q", 3, started + 30)
    assert time.monotonic() - started < 2

    txlog.mark_processed("p", 1, 1, {"rows": 10})
    committed = time.monotonic()
    txlog.commit("p", 1, 1)
    waiter.join(10)
    assert moved == [True] and time.monotonic() - committed < 10  # woken, not polled
    assert txlog.begin("p", 3, Tens()).emitted
    assert _wait_slots_held(txlog.engine) == 0  # released once the wait ended
    assert run_context.ahead_wait_slots_free(txlog) == 1


def test_no_wait_slots_configured_means_every_run_ahead_defers(txlog, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__RUN_AHEAD_WAITS", "0")
    _full_window(txlog, "p")
    started = time.monotonic()
    assert not run_context.window_moved(txlog, "p", 3, started + 30)
    assert time.monotonic() - started < 2


def test_a_dead_waiters_slot_is_free_again(txlog, one_wait_slot):
    _full_window(txlog, "p")
    with run_context.ahead_wait_slot(txlog) as slot:
        assert slot is not None
        pid = slot._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with txlog.engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            admin.commit()
        wait_until(lambda: _wait_slots_held(txlog.engine) == 0, 30, "the killed backend's lock")
        with run_context.ahead_wait_slot(txlog) as again:
            assert again is not None and again.index == 0


def _listening(txlog, pipeline: str) -> tuple[PipelineChanges, list[bool]]:
    """A listener for ``pipeline`` waiting (up to 30 s) in a thread; what its wait answered."""
    woke: list[bool] = []
    listener = PipelineChanges(txlog.engine, pipeline).__enter__()
    threading.Thread(target=lambda: woke.append(listener.wait(30.0)), daemon=True).start()
    return listener, woke


def test_a_txid_write_wakes_its_pipelines_listeners_at_its_commit_only(txlog, monkeypatch):
    monkeypatch.setattr(changes, "RECHECK", 30.0)
    for pipeline in ("p", "q"):
        txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    p_listener, p_woke = _listening(txlog, "p")
    q_listener, q_woke = _listening(txlog, "q")
    try:
        # a begin rolled back notifies nobody
        with pytest.raises(RuntimeError), txlog.engine.begin() as conn:
            from airflow_txn_provider.log.rows import TxidRows

            TxidRows(conn, "p", 1).emit(1, {"start": 0, "end": 10}, None, new=True)
            raise RuntimeError("rolled back")
        time.sleep(0.5)
        assert p_woke == [] and q_woke == []
        assert txlog.begin("p", 1, Tens()).emitted  # committed: p's listener wakes
        wait_until(lambda: p_woke == [True], 10, "p's listener to wake")
        time.sleep(0.5)
        assert q_woke == []  # another pipeline's change is not q's
    finally:
        p_listener.__exit__(None, None, None)
        q_listener.__exit__(None, None, None)


def test_a_wait_wakes_only_for_the_changes_that_can_end_it(txlog, monkeypatch):
    """The notification names the txid and the status it reached: a waiter for commits sleeps
    through begins and processed outputs, and wakes at the commit."""
    monkeypatch.setattr(changes, "RECHECK", 30.0)
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    seen: list[tuple[int, str]] = []

    def commits(change) -> bool:
        seen.append((change.txid, change.status.value))
        return change.status.value == "committed"

    woke: list[bool] = []
    listener = PipelineChanges(txlog.engine, "p").__enter__()
    threading.Thread(
        target=lambda: woke.append(listener.wait(30.0, ends_wait=commits)), daemon=True
    ).start()
    try:
        assert txlog.begin("p", 1, Tens()).emitted
        assert txlog.begin("p", 2, Tens()).emitted
        txlog.mark_processed("p", 1, 1, {"rows": 10})
        wait_until(lambda: len(seen) == 3, 10, "three changes seen")
        assert woke == []  # none of them ends the wait
        txlog.commit("p", 1, 1)
        wait_until(lambda: woke == [True], 10, "the commit to wake the waiter")
        assert seen == [(1, "processing"), (2, "processing"), (1, "processed"), (1, "committed")]
    finally:
        listener.__exit__(None, None, None)


def test_a_listen_that_delivered_rereads_the_log_less_often(txlog, monkeypatch):
    """Until its connection delivered a notification a waiter reads the log every RECHECK (its
    LISTEN may hear nothing: a pooler in transaction mode); after one, every RECHECK_HEARD."""
    monkeypatch.setattr(changes, "RECHECK", 0.3)
    monkeypatch.setattr(changes, "RECHECK_HEARD", 3.0)
    for pipeline in ("p", "q"):
        txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    with PipelineChanges(txlog.engine, "p") as listener:
        started = time.monotonic()
        assert listener.wait(10.0) is False and time.monotonic() - started < 2
        assert not listener.heard
        assert txlog.begin("q", 1, Tens()).emitted  # another pipeline's: heard, not p's
        assert listener.wait(10.0) is False and listener.heard
        started = time.monotonic()
        assert listener.wait(10.0) is False
        assert 2.5 < time.monotonic() - started < 8


def test_a_rewind_wakes_every_wait_of_its_pipeline(txlog, monkeypatch):
    from functools import partial

    from airflow_txn_provider.log.rows import TxidRows
    from airflow_txn_provider.rules.waiting import may_end_ahead_wait

    monkeypatch.setattr(changes, "RECHECK", 30.0)
    _full_window(txlog, "p")
    woke: list[bool] = []
    listener = PipelineChanges(txlog.engine, "p").__enter__()
    ends = partial(may_end_ahead_wait, txid=3, max_pending=2)
    threading.Thread(
        target=lambda: woke.append(listener.wait(30.0, ends_wait=ends)), daemon=True
    ).start()
    try:
        with txlog.engine.begin() as conn:
            assert TxidRows.rewind(conn, "p", 2, "rewound to txid 1") == 1
        wait_until(lambda: woke == [True], 10, "the rewind to wake the run ahead")
    finally:
        listener.__exit__(None, None, None)


def test_without_a_listen_connection_a_wait_polls(txlog, monkeypatch):
    listener = PipelineChanges(txlog.engine, "p", fallback=0.01)
    started = time.monotonic()
    assert listener.wait(5.0) is False  # not entered: no connection, a poll's sleep
    assert time.monotonic() - started < 2
