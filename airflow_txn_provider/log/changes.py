"""Wake-ups when a pipeline's txids change: Postgres ``LISTEN``/``NOTIFY``, not polls.

Every write of a txid's row (:class:`~airflow_txn_provider.log.rows.TxidRows`) notifies
:data:`CHANNEL` with the pipeline, the txid and the status it reached, in the writing transaction
(:func:`notify_changed`: delivered at the commit, never for a rollback). A task that waits in its
worker blocks on :class:`PipelineChanges`, at no CPU, until a change that can end its wait
arrives (:mod:`airflow_txn_provider.rules.waiting`). The wake-up is a hint, never the truth: the
waiter reads the log after each one, and at least every :data:`RECHECK` seconds
(:data:`RECHECK_HEARD` once its connection has delivered one), so a ``LISTEN`` that hears nothing
(a connection pooler in transaction mode) degrades to polling.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, text

from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.rules.waiting import TxidChange

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.sql.functions import Function

log = logging.getLogger(__name__)

CHANNEL = "txn_pipeline_changed"
"""The channel every txid write notifies, with ``"<pipeline> <txid> <status>"`` as the payload (a
pipeline's name has no space: :mod:`airflow_txn_provider.rules.names`)."""
RECHECK = 1.0
"""Seconds a waiter waits at most without a wake-up before it reads the log again."""
RECHECK_HEARD = 5.0
"""The same, once its connection delivered a notification (of any pipeline): ``LISTEN`` works
there, so a read per second per waiter (three runs ahead wait at once) would only be a poll."""


def notify_changed(pipeline: str, txid: int, status: TxStatus) -> Function[Any]:
    """The SQL expression that notifies :data:`CHANNEL` that ``pipeline``'s ``txid`` reached
    ``status``: put in a write's ``RETURNING``, it costs no round trip of its own."""
    return func.pg_notify(CHANNEL, f"{pipeline} {txid} {status.value}")


def notify_rewound(pipeline: str) -> Function[Any]:
    """The SQL expression that notifies :data:`CHANNEL` that ``pipeline`` was rewound (many txids
    failed at once): the pipeline's name alone, which wakes every wait (:func:`change_of`)."""
    return func.pg_notify(CHANNEL, pipeline)


def change_of(payload: str, pipeline: str) -> TxidChange | None:
    """The change a notification of ``pipeline`` says; ``None`` for another pipeline's. A payload
    of the pipeline's name alone (a rewind; a writer of an earlier release, during an upgrade) is
    a change of an unknown txid: txid 0, failed, which every wait reads the log for."""
    name, _, rest = payload.partition(" ")
    if name != pipeline:
        return None
    txid, _, status = rest.partition(" ")
    try:
        return TxidChange(int(txid), TxStatus(status))
    except ValueError:
        return TxidChange(0, TxStatus.FAILED)


class PipelineChanges:
    """A connection of its own listening for ``pipeline``'s changes, for a ``with`` block.

    Listen first, then read the log, then :meth:`wait`: a change between the read and the wait
    is queued on the connection, so no wake-up is lost. Without a listening connection (the
    ``LISTEN`` failed) :meth:`wait` sleeps ``fallback`` seconds instead, as a poll would.
    """

    def __init__(self, engine: Engine, pipeline: str, *, fallback: float = 0.1) -> None:
        self.engine, self.pipeline, self.fallback = engine, pipeline, fallback
        self._conn: Connection | None = None
        self.heard = False
        """Whether the connection delivered a notification: its ``LISTEN`` works."""

    def __enter__(self) -> PipelineChanges:
        try:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except Exception as err:
            log.warning("pipeline=%s: no LISTEN connection, polling (%s)", self.pipeline, err)
            return self
        try:
            conn.execute(text(f"LISTEN {CHANNEL}"))
        except Exception as err:
            conn.invalidate()
            conn.close()
            log.warning("pipeline=%s: LISTEN refused, polling (%s)", self.pipeline, err)
            return self
        self._conn = conn
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(text("UNLISTEN *"))  # back to the pool listening to nothing
        except Exception:
            conn.invalidate()
        conn.close()

    def wait(
        self, timeout: float, *, ends_wait: Callable[[TxidChange], bool] | None = None
    ) -> bool:
        """Block until ``pipeline`` changed in a way that ``ends_wait`` accepts (any change
        without it): True; at most ``timeout`` seconds and :data:`RECHECK` (False: read the log
        all the same)."""
        timeout = max(0.0, min(timeout, RECHECK_HEARD if self.heard else RECHECK))
        if self._conn is None:
            time.sleep(min(timeout, self.fallback))
            return False
        raw: Any = self._conn.connection.driver_connection  # psycopg's Connection
        until = time.monotonic() + timeout
        try:
            while (left := until - time.monotonic()) > 0:
                for note in raw.notifies(timeout=left):
                    self.heard = True
                    change = change_of(note.payload, self.pipeline)
                    if change is not None and (ends_wait is None or ends_wait(change)):
                        return True
                    if time.monotonic() >= until:
                        break
        except Exception as err:  # the server went away: poll until the block ends
            log.warning("pipeline=%s: LISTEN connection lost, polling (%s)", self.pipeline, err)
            self._conn.invalidate()
            self._conn.close()
            self._conn = None
        return False
