"""A fitted window's Spark work slots on a real Postgres: one txid's Spark work per core, the
others wait in Postgres (no poll) and go the moment it ends; an explicit ``max_pending`` has no
bound; a wait that runs out goes on without a slot rather than hold the txid for ever."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from airflow_txn_provider.log.advisory import waited_slot
from airflow_txn_provider.rules.config import FIRST_WINDOW, spark_work_slots
from airflow_txn_provider.spark import work_slots
from airflow_txn_provider.spark.work_slots import spark_work_slot
from tests.conftest import wait_until

CLASS = 0x7478_0001  # a lock class of this test's own


def _job(pipeline: str, txid: int, *, fitted: bool = True) -> SimpleNamespace:
    return SimpleNamespace(pipeline=pipeline, txid=txid, fit_window=fitted)


def test_with_every_slot_taken_a_wait_holds_the_turns_slot_once_it_is_let_go(engine):
    events: list[str] = []
    with waited_slot(engine, CLASS, [11, 12], turn=0, timeout=30) as first:
        with waited_slot(engine, CLASS, [11, 12], turn=0, timeout=30) as second:
            assert first is not None and second is not None
            assert (first.index, second.index) == (0, 1)  # the free ones first

            def third() -> None:
                with waited_slot(engine, CLASS, [11, 12], turn=3, timeout=30) as slot:
                    events.append(f"third holds {slot.index if slot else None}")

            waiter = threading.Thread(target=third)
            waiter.start()
            time.sleep(1.0)
            assert events == []  # both taken: it waits (for slot 3 % 2 = 1)
            # said before the block releases it: the waiter may take it the moment it is free
            events.append("second let go")
        waiter.join(10)
    assert events == ["second let go", "third holds 1"]


def test_a_wait_that_runs_out_goes_on_without_a_slot(engine, db_url):
    from sqlalchemy import create_engine, text

    one = create_engine(db_url, pool_size=1, max_overflow=0)  # the waiter's one connection
    try:
        with waited_slot(engine, CLASS, [21], turn=0, timeout=30) as held:
            assert held is not None
            started = time.monotonic()
            with waited_slot(one, CLASS, [21], turn=0, timeout=0.3) as none:
                assert none is None
            assert time.monotonic() - started < 5
        with one.connect() as conn:  # back in the pool as it came: no lock_timeout left on it
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"
        with waited_slot(one, CLASS, [21], turn=0, timeout=0.3) as again:
            assert again is not None  # free again: the timed-out wait left nothing held
    finally:
        one.dispose()


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
