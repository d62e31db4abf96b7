"""A fitted window's Spark work slots on a real Postgres: one txid's Spark work per core, the
others wait in Postgres (no poll) and go the moment it ends; an explicit ``max_pending`` has no
bound; a wait that runs out goes on without a slot rather than hold the txid for ever (the
advisory-lock slots themselves: tests/integration/log/test_advisory.py)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from airflow_txn_provider.rules.config import FIRST_WINDOW, spark_work_slots
from airflow_txn_provider.spark import work_slots
from airflow_txn_provider.spark.work_slots import spark_work_slot
from tests.conftest import wait_until


def _job(pipeline: str, txid: int, *, fitted: bool = True) -> SimpleNamespace:
    return SimpleNamespace(pipeline=pipeline, txid=txid, fit_window=fitted)


def test_a_fitted_windows_second_txid_computes_after_the_first(txlog):
    for pipeline in ("fitted", "other"):
        txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=None)
    assert txlog.view("fitted").max_pending == FIRST_WINDOW == 2
    assert spark_work_slots(FIRST_WINDOW) == 1  # a one-core Spark: one txid computes at a time
    order: list[str] = []

    def second() -> None:
        with spark_work_slot(txlog, _job("fitted", 2)) as slot:
            order.append(f"2 computes in slot {slot}")

    with spark_work_slot(txlog, _job("fitted", 1)) as slot:
        order.append(f"1 computes in slot {slot}")
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(1.0)
        assert order == ["1 computes in slot 0"]
        # another pipeline's txids are not held by it
        with spark_work_slot(txlog, _job("other", 1, fitted=True)) as theirs:
            assert theirs is not None
        order.append("1 done")
    waiter.join(10)
    assert order == ["1 computes in slot 0", "1 done", "2 computes in slot 0"]


def test_an_explicit_window_has_no_bound(txlog):
    txlog.register_pipeline("explicit", source_kind="transactional", max_pending=2)
    with spark_work_slot(txlog, _job("explicit", 1, fitted=False)) as first:
        with spark_work_slot(txlog, _job("explicit", 2, fitted=False)) as second:
            assert first is None and second is None  # no slot: nothing waited


def test_a_stuck_txid_holds_the_later_ones_at_most_the_wait(txlog, monkeypatch):
    monkeypatch.setattr(work_slots, "WAIT_AT_MOST", 0.5)
    txlog.register_pipeline("stuck", source_kind="transactional", max_pending=None)
    done: list[int | None] = []
    with spark_work_slot(txlog, _job("stuck", 1)):
        t = threading.Thread(
            target=lambda: done.append(spark_work_slot(txlog, _job("stuck", 2)).__enter__())
        )
        t.start()
        wait_until(lambda: done == [None], 10, "txid 2 to go on without a slot")
