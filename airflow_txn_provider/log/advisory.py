"""Slots held with Postgres advisory locks: at most so many processes do a thing at once.

A slot is a session-level advisory lock on a connection of the slot's own, held until released:
a process that dies drops it with its connection, so no slot outlives its holder and none needs
cleaning up. The locks live in the log's database; ``lock_class`` (the first of the two int4
keys) keeps each use's slots apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)


class HeldSlot:
    """An advisory lock held on a connection of its own; ``index`` is its place in the keys."""

    def __init__(self, conn: Connection, lock_class: int, key: int, index: int) -> None:
        self.lock_class, self.key, self.index = lock_class, key, index
        self._conn: Connection | None = conn

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            unlocked = conn.execute(
                text("SELECT pg_advisory_unlock(:c, :k)"), {"c": self.lock_class, "k": self.key}
            ).scalar()
        except Exception:  # the connection is gone, and its lock with it
            unlocked = False
        if not unlocked:
            conn.invalidate()  # never back to the pool still holding the lock
        conn.close()


def try_hold(engine: Engine, lock_class: int, keys: Iterable[int]) -> HeldSlot | None:
    """The first of ``keys`` whose lock is free, now held; ``None`` when every one is taken."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        for index, key in enumerate(keys):
            got = conn.execute(
                text("SELECT pg_try_advisory_lock(:c, :k)"), {"c": lock_class, "k": key}
            ).scalar()
            if got:
                return HeldSlot(conn, lock_class, key, index)
    except BaseException:
        conn.invalidate()  # whatever it holds goes with it
        conn.close()
        raise
    conn.close()
    return None


def held_count(engine: Engine, lock_class: int) -> int:
    """How many of ``lock_class``'s slots are held now, by anyone, in the log's database."""
    with engine.connect() as conn:
        held = conn.execute(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
                "AND l.classid = :c AND d.datname = current_database()"
            ),
            {"c": lock_class},
        ).scalar_one()
    return int(held)


@contextmanager
def _held_for_the_block(
    lock_class: int, acquire: Callable[[], HeldSlot | None]
) -> Iterator[HeldSlot | None]:
    """The slot ``acquire`` gets, released after the block; ``None`` when it got none or the log
    cannot be reached (callers treat a slot as an optimisation: without one, they do the slower
    thing, never stuck on one)."""
    slot: HeldSlot | None = None
    try:
        slot = acquire()
    except Exception as err:  # the log is restarting
        log.warning(
            "no advisory slot (lock class %#x): %s: %s", lock_class, type(err).__name__, err
        )
    try:
        yield slot
    finally:
        if slot is not None:
            slot.release()


def held_slot(
    engine: Engine, lock_class: int, keys: Iterable[int]
) -> AbstractContextManager[HeldSlot | None]:
    """:func:`try_hold` for the block: ``None`` when every slot is taken."""
    return _held_for_the_block(lock_class, lambda: try_hold(engine, lock_class, keys))


def waited_slot(
    engine: Engine, lock_class: int, keys: Sequence[int], *, turn: int, timeout: float
) -> AbstractContextManager[HeldSlot | None]:
    """The first free one of ``keys``, held for the block; with every one taken, wait for
    ``keys[turn % len(keys)]`` (in Postgres, on the lock: no CPU, no poll), at most ``timeout``
    seconds: ``None`` when the wait ran out."""
    return _held_for_the_block(
        lock_class,
        lambda: (
            try_hold(engine, lock_class, keys)
            or _wait_for(engine, lock_class, keys, turn % len(keys), timeout)
        ),
    )


def _wait_for(
    engine: Engine, lock_class: int, keys: Sequence[int], index: int, timeout: float
) -> HeldSlot | None:
    from sqlalchemy.exc import OperationalError

    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        conn.execute(
            text("SELECT set_config('lock_timeout', :ms, false)"), {"ms": f"{int(timeout * 1000)}"}
        )
        try:
            conn.execute(
                text("SELECT pg_advisory_lock(:c, :k)"), {"c": lock_class, "k": keys[index]}
            )
        except OperationalError as err:
            if getattr(err.orig, "sqlstate", None) != "55P03":  # not lock_not_available
                raise
            log.warning(
                "advisory slot %s (lock class %#x): waited %.0f s", index, lock_class, timeout
            )
            conn.execute(text("RESET lock_timeout"))  # back to the pool as it came
            conn.close()
            return None
        conn.execute(text("RESET lock_timeout"))
        return HeldSlot(conn, lock_class, keys[index], index)
    except BaseException:
        conn.invalidate()  # whatever it holds goes with it
        conn.close()
        raise
