"""The run ahead's wait in its worker, on a real Postgres log: it begins the moment the oldest txid
commits, and at most ``[txn_provider] run_ahead_waits`` such waits hold worker slots at once, all
pipelines of the log together (advisory locks: a holder that dies frees its slot)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from airflow_txn_provider import run_context
from airflow_txn_provider.log.advisory import held_count
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
    monkeypatch.setattr(run_context, "AHEAD_POLL", 0.02)


def test_a_run_ahead_waits_for_the_commit_and_a_second_finds_no_slot(txlog, one_wait_slot):
    for pipeline in ("p", "q"):
        _full_window(txlog, pipeline)
    assert run_context.ahead_wait_slot_free(txlog)
    moved: list[bool] = []
    waiter = threading.Thread(
        target=lambda: moved.append(run_context.window_moved(txlog, "p", 3, time.monotonic() + 30))
    )
    waiter.start()
    wait_until(lambda: _wait_slots_held(txlog.engine) == 1, 10, "p's run ahead to hold a slot")

    # A claim now creates no run ahead (it would defer), and another pipeline's run ahead (one
    # created before) finds the log's one slot taken, so it defers at once.
    assert not run_context.ahead_wait_slot_free(txlog)
    started = time.monotonic()
    assert not run_context.window_moved(txlog, "q", 3, started + 30)
    assert time.monotonic() - started < 2

    txlog.mark_processed("p", 1, 1, {"rows": 10})
    txlog.commit("p", 1, 1)
    waiter.join(10)
    assert moved == [True]
    assert txlog.begin("p", 3, Tens()).emitted
    assert _wait_slots_held(txlog.engine) == 0  # released once the wait ended
    assert run_context.ahead_wait_slot_free(txlog)


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
