"""Spark Connect server sessions that a pipeline's txids reuse, each used by one process at a time.

A task process lives for one txid, and a new server session costs the server's JVM its first
query's set-up (analyzer, catalog state), so a txid's process attaches to a slot's session by
its id. It *leases* one of :data:`SLOTS` slots with a Postgres advisory lock held for its Spark
work (a dead process drops it with its connection); with every slot taken, the txid gets a
session of its own. A killed run interrupts only its own tagged operations
(:meth:`~airflow_txn_provider.operators.spark_runner.SparkConnectRunner.kill`). A failed attempt
releases the slot's server session, and the slot moves to its next *generation*, a new id
(:func:`slot_session_id`), as it does every :data:`ROTATION_SECONDS` and after the server
expired the session. So a transform may find an earlier txid's temporary views or settings of
its pipeline (the lake staging sets one Parquet setting, always to the same value);
``reuse_sessions=False`` on the runner gives a session per txid.
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.log.advisory import HeldSlot, held_slot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

SLOTS = 16
"""Session slots per pipeline: at least the txids (and jobs) that process at once."""
ROTATION_SECONDS = 1800
GENERATIONS = 32
"""Generations a lessee tries (each one a failed attempt since the rotation) before it takes a
session of its own."""
RETRY_MAX_BACKOFF_MS = 4000
RETRY_MAX_RETRIES = 12
"""The Spark Connect client's retries: 50 ms doubling to 4 s, 12 tries (~26 s in all)."""

_SLOT_LOCK_CLASS = 0x7478_6E53  # "txnS": the first key of the two-key advisory locks of slots
_NAMESPACE = uuid.UUID("6f1c54a2-8a57-4a39-9d0e-3c1b2f8a7e11")


@contextmanager
def keep_classic_mode() -> Iterator[None]:
    """Undo, on exit, PySpark's process-wide "Spark Connect mode" marks that a remote session sets
    (:data:`~airflow_txn_provider.spark.job.CONNECT_MODE_ENV`). Left behind, they turn every later
    classic session of the process into a Connect client (a classic read then asks for the active
    session and fails with ``SESSION_ALREADY_EXIST``), and every spark-submit it starts too. An
    Airflow worker's process lives on (forked, warmed) and runs job after job: each job cleans up
    after itself. PySpark's functions dispatch on the marks, so they stay for the block."""
    import os

    # at call time: at the top it adds to a DAG file's parse (the job and the log's
    # write side: 8 modules)
    from airflow_txn_provider.spark.job import CONNECT_MODE_ENV

    saved = {name: os.environ.get(name) for name in CONNECT_MODE_ENV}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def connect_session(url: str) -> Iterator[SparkSession]:
    """A Spark Connect session of its own at ``url`` for the block, stopped after it, the process
    left as it was (:func:`keep_classic_mode`). ``create()``, not ``getOrCreate()``: a classic
    session running in the process (a fill's driver, a test's) must not refuse it."""
    from pyspark.sql import SparkSession

    with keep_classic_mode():
        session = SparkSession.builder.remote(url).create()
        try:
            yield session
        finally:
            session.stop()


def bound_client_retries(session: Any) -> None:
    """Bound how long ``session``'s client waits for an unreachable server.

    PySpark's default policy tolerates 10 minutes, its waits growing fourfold to a minute, so a
    client may notice a restarted server long after it is back. Here the waits double up to
    :data:`RETRY_MAX_BACKOFF_MS`, for about half a minute in all; the runner's own retry
    (``connect_timeout``) waits longer for a session, and a job whose server went away fails and
    is replayed.
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session.client.set_retry_policies(
        [
            DefaultPolicy(
                max_retries=RETRY_MAX_RETRIES,
                backoff_multiplier=2.0,
                initial_backoff=50,
                max_backoff=RETRY_MAX_BACKOFF_MS,
            )
        ]
    )


def slot_session_id(pipeline: str, url: str, slot: int, generation: int, now: float) -> str:
    """The server session id of ``slot`` of ``pipeline`` on the server ``url`` (without its
    parameters), for this rotation period and ``generation``."""
    period = int(now // ROTATION_SECONDS)
    name = "\0".join([pipeline, url, str(slot), str(period), str(generation)])
    return str(uuid.uuid5(_NAMESPACE, name))


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port``, maybe with ``/;key=value`` parameters) naming ``session_id``."""
    base, _, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    # An Airflow connection's URL ends in "/" (sc://host:port/): one slash before the parameters.
    return f"{base.rstrip('/')}/;" + ";".join([*kept, f"session_id={session_id}"])


def is_session_closed(err: BaseException) -> bool:
    """Whether ``err`` says the server closed the session id (released after a failure, or
    expired idle): it never opens that id again."""
    condition = getattr(err, "getCondition", None)
    found = condition() if callable(condition) else None
    return found == "INVALID_HANDLE.SESSION_CLOSED" or "SESSION_CLOSED" in str(err)[:300]


class SessionSlot:
    """A leased slot: ``session_ids()`` are the ids to try, in order."""

    def __init__(self, pipeline: str, url: str, held: HeldSlot) -> None:
        self.pipeline, self.url, self.slot = pipeline, url, held.index
        self._held = held

    def session_ids(self) -> Iterator[str]:
        # The server's address, not its parameters (a token): sc://host:port
        now, server = time.time(), self.url.partition("/;")[0].rstrip("/")
        for generation in range(GENERATIONS):
            yield slot_session_id(self.pipeline, server, self.slot, generation, now)

    def release(self) -> None:
        self._held.release()


def _slot_key(pipeline: str, slot: int) -> int:
    # int4: a pipeline's slots are consecutive keys; two pipelines whose hashes meet only share
    # exclusion (a slot may look taken), never a session.
    return ((zlib.crc32(pipeline.encode()) & 0x0FFF_FFFF) * SLOTS + slot) & 0x7FFF_FFFF


@contextmanager
def leased_slot(engine: Engine, pipeline: str, url: str) -> Iterator[SessionSlot | None]:
    """The first free session slot of ``pipeline``, held until the block ends; ``None`` when all
    are taken or the lock cannot be had (the caller then uses a session of its own)."""
    keys = [_slot_key(pipeline, n) for n in range(SLOTS)]
    with held_slot(engine, _SLOT_LOCK_CLASS, keys) as held:
        if held is None:
            log.info("no free Spark session slot of %s (%d): a session of its own", pipeline, SLOTS)
            yield None
        else:
            yield SessionSlot(pipeline, url, held)
