"""Keeping a processing attempt's lease (transactions/lease.py) against a real Postgres: kept
while alive, expired once the process is gone, a lost attempt stopped, a finished one handed
over."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.transactions.lease import LeaseKeeper, holder_name


class Tens(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"start": (prev or {"end": 0})["end"], "end": txid * 10}


@pytest.fixture
def running(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    for txid in (1, 2, 3):
        txlog.begin("p", txid, Tens())
    return txlog


def test_a_kept_lease_never_expires_and_a_dropped_one_does(running):
    holder = holder_name("process_words")
    with LeaseKeeper(running, "p", 2, 1, holder=holder, timeout=1.0) as keeper:
        for _ in range(6):  # three timeouts of work: never failed while alive
            time.sleep(0.5)
            assert running.expire_lease("p", 2, 1) == ()
        assert keeper.renewals >= 10
    # the process is gone: nobody renews, and one timeout later the lease has run out
    time.sleep(1.2)
    assert running.expire_lease("p", 2, 1) == (2, 3)
    info = running.transaction("p", 2)
    assert info.status is TxStatus.FAILED and "lease expired" in info.last_error
    assert holder in info.last_error
    assert running.transaction("p", 1).status is TxStatus.PROCESSING  # before it: untouched


def test_a_lost_attempt_stops_its_work(running):
    stopped = threading.Event()
    with LeaseKeeper(running, "p", 3, 1, holder="h", timeout=0.5, on_lost=stopped.set) as keeper:
        running.fail("p", 2, 1, error="boom")  # the cascade fails txid 3 too
        assert stopped.wait(5), "the keeper did not notice its attempt was failed"
        assert keeper.lost


def test_an_attempt_whose_output_is_recorded_is_done_not_stopped(running):
    """A job that recorded its output may still be shutting Spark down when the next renewal
    comes: the keeper stops renewing and leaves it alone (stopping it would fail the attempt)."""
    stopped = threading.Event()
    with LeaseKeeper(running, "p", 2, 1, holder="h", timeout=0.5, on_lost=stopped.set) as keeper:
        running.mark_processed("p", 2, 1)
        deadline = time.monotonic() + 5
        while not keeper.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert keeper.done and not keeper.lost
    assert not stopped.is_set()
    assert running.transaction("p", 2).status is TxStatus.PROCESSED


def _lease_left(txlog, txid):
    view = txlog.view("p")
    rec = view.record(txid)
    assert rec is not None and rec.lease_expires_at is not None and view.now is not None
    return rec.lease_expires_at - view.now


def test_a_job_that_ends_well_hands_the_lease_over_to_the_next_task(running):
    """One of several jobs ends, the txid still processes: the lease lasts ``handover`` seconds,
    time for the next task to start. A job that fails hands nothing over."""
    with LeaseKeeper(running, "p", 2, 1, holder="h", timeout=1.0, handover=120.0):
        pass
    assert _lease_left(running, 2).total_seconds() > 100
    with (
        pytest.raises(RuntimeError),
        LeaseKeeper(running, "p", 3, 1, holder="h", timeout=1.0, handover=120.0),
    ):
        raise RuntimeError("the job failed")
    assert _lease_left(running, 3).total_seconds() < 2
