"""A processed txid's task waits in its worker for the txids before it to commit, on a real
Postgres log: it ends once its txid commits (by the task before it, which commits the processed
txids after its own), stops waiting once a txid before it fails, and without a free slot does
not wait (``[txn_provider] commit_waits``)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from airflow_txn_provider import run_context
from airflow_txn_provider.log.advisory import held_count
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.transactions.commit import commit_ready
from tests.conftest import wait_until

LOG = logging.getLogger(__name__)


class Tens(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"start": (prev or {"end": 0})["end"], "end": txid * 10}


def two_processing(txlog, name: str) -> SimpleNamespace:
    """Txids 1 and 2 begun; 2 processed first: its task waits for 1."""
    txlog.register_pipeline(name, source_kind="transactional", max_pending=4)
    for txid in (1, 2):
        assert txlog.begin(name, txid, Tens()).emitted
    txlog.mark_processed(name, 2, 1, {"rows": 20})
    return SimpleNamespace(name=name, window_bound=4, sinks=(), expectations=())


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(run_context, "COMMIT_POLL", 0.02)


def _waiting(txlog, txn_pipeline) -> tuple[threading.Thread, list]:
    got: list = []
    waiter = threading.Thread(
        target=lambda: got.append(run_context.commit_in_turn(txlog, txn_pipeline, 2, LOG))
    )
    waiter.start()
    wait_until(
        lambda: held_count(txlog.engine, run_context._COMMIT_LOCK_CLASS) == 1, 10, "a wait slot"
    )
    return waiter, got


def test_a_task_waits_until_the_task_before_commits_its_txid_too(txlog):
    txn_pipeline = two_processing(txlog, "p")
    waiter, got = _waiting(txlog, txn_pipeline)
    time.sleep(0.3)
    assert waiter.is_alive() and txlog.view("p").last_committed == 0
    txlog.mark_processed("p", 1, 1, {"rows": 10})
    by_task_before = commit_ready(txlog, txn_pipeline, LOG)  # txid 1's task commits what is ready
    waiter.join(10)
    ((own, done),) = got
    # the waiting task's own look may race it to txids 1 and 2: committing is idempotent
    assert own and set(by_task_before) | set(done) == {1, 2}
    assert txlog.view("p").last_committed == 2
    assert held_count(txlog.engine, run_context._COMMIT_LOCK_CLASS) == 0


def test_the_waiting_task_commits_what_became_ready_itself(txlog):
    txn_pipeline = two_processing(txlog, "q")
    waiter, got = _waiting(txlog, txn_pipeline)
    txlog.mark_processed("q", 1, 1, {"rows": 10})  # its task ended before committing
    waiter.join(10)
    assert got == [(True, [1, 2])]


def test_a_failure_before_it_ends_the_wait(txlog):
    txn_pipeline = two_processing(txlog, "r")
    waiter, got = _waiting(txlog, txn_pipeline)
    started = time.monotonic()
    txlog.fail("r", 1, 1, error="boom")
    waiter.join(10)
    assert got == [(False, [])] and time.monotonic() - started < 5


def test_no_slot_no_wait(txlog, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__COMMIT_WAITS", "0")
    txn_pipeline = two_processing(txlog, "s")
    started = time.monotonic()
    assert run_context.commit_in_turn(txlog, txn_pipeline, 2, LOG) == (False, [])
    assert time.monotonic() - started < 2
