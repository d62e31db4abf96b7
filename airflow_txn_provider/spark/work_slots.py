"""At most one txid's Spark work per core of the Spark a fitted window follows.

A fitted window (:func:`~airflow_txn_provider.rules.config.fitted_window`) keeps one txid per core
in flight and one more, to start, stage or commit while the others compute; unbounded, that one's
Spark work would share the cores instead (docs/spark.md, "How many txids process at once"). So a
txid's Spark work (read, transform, collect, the lake sinks' writes) holds one of the pipeline's
:func:`~airflow_txn_provider.rules.config.spark_work_slots`: a Postgres advisory lock on a
connection of its own, waited for in Postgres (no CPU) and let go as its Spark work ends, before
its staging and commit. A pipeline with an explicit ``max_pending`` has no such bound.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from airflow_txn_provider.log.advisory import waited_slot
from airflow_txn_provider.rules.config import spark_work_slots

if TYPE_CHECKING:
    from airflow_txn_provider.spark.job import BatchJob
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

WAIT_AT_MOST = 600.0
"""Seconds a txid waits for a Spark work slot before it computes without one (a txid before it
stuck in Spark must not hold every later one for ever; its lease and the failure sensor deal
with it)."""
_LOCK_CLASS = 0x7478_6E4B  # "txnK": the advisory locks of the Spark work slots
_KEYS_PER_PIPELINE = 1024
"""More slots than any fitted window has (``FITTED_WINDOW_BOUND``)."""


def _key(pipeline: str, slot: int) -> int:
    # int4: a pipeline's slots are consecutive keys; pipelines whose hashes meet only share slots
    return ((zlib.crc32(pipeline.encode()) & 0x001F_FFFF) * _KEYS_PER_PIPELINE + slot) & 0x7FFF_FFFF


@contextlib.contextmanager
def spark_work_slot(
    txlog: TransactionLog, job: BatchJob, timings: dict[str, float] | None = None
) -> Iterator[int | None]:
    """Hold one of ``job``'s pipeline's Spark work slots for the block, if its window is fitted
    (else ``None`` at once): the first free one, or, with all taken, the one of the txid a window
    before it (``txid % slots``: the oldest in flight, whose work ends first). Yields the slot's
    index, ``None`` without one; the seconds it waited go to ``timings["spark_slot"]``."""
    if not job.fit_window:
        yield None
        return
    started = time.monotonic()
    window = txlog.view(job.pipeline).max_pending
    keys = [_key(job.pipeline, n) for n in range(spark_work_slots(window))]
    with waited_slot(txlog.engine, _LOCK_CLASS, keys, turn=job.txid, timeout=WAIT_AT_MOST) as slot:
        if timings is not None:
            timings["spark_slot"] = time.monotonic() - started
        yield None if slot is None else slot.index
