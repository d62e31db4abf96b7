"""Slots held with Postgres advisory locks (log/advisory.py) on a real Postgres: with every slot
taken a wait holds the turn's slot once it is let go (waited in Postgres, no poll), and a wait
that runs out goes on without a slot."""

from __future__ import annotations

import threading
import time

from airflow_txn_provider.log.advisory import waited_slot

CLASS = 0x7478_0001  # a lock class of this test's own


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
