"""Retention: deleting the rows of old committed txids, so the log does not grow forever.

The rule of what may go is the coordinator's
(:func:`~airflow_txn_provider.rules.history.prune_range`): the rows of txids older than the newest
``keep_txids`` committed ones, a bounded batch at a time. A commit prunes now and then under the
pipeline's lock it holds anyway (:func:`prune_locked`); :meth:`LogRetention.prune` does the same on
demand, and :meth:`LogRetention.retention` reports the totals. The delete itself is the txid rows'
one writer's (:meth:`~airflow_txn_provider.log.rows.TxidRows.prune`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from airflow_txn_provider.log.fill_progress import fill_floor
from airflow_txn_provider.log.models import PIPELINES
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import TxidRows, lock_pipeline
from airflow_txn_provider.rules.config import PRUNE_BATCH
from airflow_txn_provider.rules.exceptions import UnknownPipelineError
from airflow_txn_provider.rules.history import prune_range, rewind_floor
from airflow_txn_provider.state import load_states
from airflow_txn_provider.state.undo import UndoRecords
from airflow_txn_provider.utils.retries import retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionInfo:
    """A pipeline's retention setting and what it pruned so far (every pruned txid committed)."""

    pipeline: str
    keep_txids: int
    pruned_txids: int
    pruned_attempts: int
    pruned_failed_attempts: int
    """Attempts of pruned txids that had failed (each was replayed before its txid committed)."""
    pruned_through_txid: int
    """Every txid up to this one was pruned (0: none)."""
    undo_from_txid: int = 1
    """The first txid whose commit wrote undo records (see migration 0009)."""

    @property
    def rewind_floor(self) -> int:
        """The oldest txid a rewind can go back to now
        (:func:`~airflow_txn_provider.rules.history.rewind_floor`)."""
        return rewind_floor(self.pruned_through_txid, self.undo_from_txid)


def prune_locked(conn: Connection, pipeline: str, due: range) -> int:
    """Delete the rows of committed txids ``due`` (holding the pipeline's lock) and add them
    to the pipeline's totals, in one statement; then the states' undo records of those txids.
    Only committed rows at or below the last committed txid go: an in-flight txid is never
    touched, whatever ``due`` says."""
    pruned = TxidRows.prune(conn, pipeline, due)
    for state in load_states(conn, pipeline).values():  # a rewind reaches no further back
        UndoRecords(state.backing).prune(conn, due[-1])
    log.info("pipeline=%s retention pruned %s txid(s) %s..%s", pipeline, pruned, due.start, due[-1])
    return pruned


class LogRetention(LogPart):
    """Pruning on demand, and what retention pruned so far."""

    @retry_transient
    def prune(self, pipeline: str, *, batch: int = PRUNE_BATCH) -> int:
        """Delete the rows of up to ``batch`` txids that retention lets go (what each commit does
        now and then, by itself); returns how many txids were pruned. Takes the pipeline's lock:
        safe beside commits, and idempotent."""
        with self.engine.begin() as conn:
            row = lock_pipeline(conn, pipeline)
            due = prune_range(
                int(row.last_committed_txid),
                int(row.keep_txids),
                int(row.pruned_through_txid),
                batch=batch,
                keep_from=fill_floor(conn, pipeline),
            )
            return prune_locked(conn, pipeline, due) if due else 0

    @retry_transient
    def retention(self, pipeline: str) -> RetentionInfo:
        """The pipeline's ``keep_txids``, the totals of what retention pruned, and how far back a
        rewind reaches."""
        with self.engine.connect() as conn:
            row = conn.execute(select(PIPELINES).where(PIPELINES.c.name == pipeline)).one_or_none()
        if row is None:
            raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
        return RetentionInfo(
            pipeline=pipeline,
            keep_txids=int(row.keep_txids),
            pruned_txids=int(row.pruned_txids),
            pruned_attempts=int(row.pruned_attempts),
            pruned_failed_attempts=int(row.pruned_failed_attempts),
            pruned_through_txid=int(row.pruned_through_txid),
            undo_from_txid=int(row.undo_from_txid),
        )
