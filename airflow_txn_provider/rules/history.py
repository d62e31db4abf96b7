"""The rules over a pipeline's history, pure like the coordinator's: how much of it retention
keeps (:func:`retention_horizon`, :func:`prune_range`) and how far back a rewind reaches and what
it undoes (:func:`rewind_floor`, :func:`plan_rewind`, :func:`rewound_through`). The retention
job (:mod:`airflow_txn_provider.transactions.retention`) and the rewind
(:mod:`airflow_txn_provider.transactions.rewind`) ask them under the pipeline's lock and write their
answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_txn_provider.rules.config import PRUNE_BATCH, PRUNE_EVERY, validate_keep_txids
from airflow_txn_provider.rules.exceptions import RewindAheadError, RewindTooFarError
from airflow_txn_provider.rules.records import PipelineView

# -- retention ---------------------------------------------------------------------------------


def retention_horizon(last_committed: int, keep_txids: int) -> int:
    """The newest txid retention may prune: every txid up to it is committed and older than the
    newest ``keep_txids`` committed ones (0: none).

    What the rules read is never below it: the last committed txid (its metadata is where the next
    txid's batch starts; ``keep_txids >= 1`` keeps it), the txids in flight (all above it) and a
    failed txid's attempt history (failed txids are in flight). Older txids are committed for good:
    a begin, commit or failure naming one answers from ``last_committed`` alone.
    """
    validate_keep_txids(keep_txids)
    return max(0, last_committed - keep_txids)


def prune_range(
    last_committed: int,
    keep_txids: int,
    pruned_through: int,
    *,
    batch: int = PRUNE_BATCH,
    every: int = 1,
    keep_from: int | None = None,
) -> range:
    """Txids whose rows may be deleted now: those after ``pruned_through`` (pruned already) up to
    :func:`retention_horizon`, at most ``batch`` of them, oldest first; none until at least
    ``every`` are due. Idempotent: once pruned, ``pruned_through`` moves and they are not asked
    for again. ``keep_from``: a txid whose row is needed still, with every later one (an output
    filling from history reads their batches: :func:`~airflow_txn_provider.rules.filling.\
retention_floor`)."""
    if batch < 1 or every < 1:
        raise ValueError(f"batch and every must be >= 1, got {batch}, {every}")
    horizon = retention_horizon(last_committed, keep_txids)
    if keep_from is not None:
        horizon = min(horizon, keep_from - 1)
    if horizon - pruned_through < every:
        return range(0)
    return range(pruned_through + 1, min(horizon, pruned_through + batch) + 1)


# -- rewind --------------------------------------------------------------------------------------


REWOUND_BY = 0
"""``failed_by`` of an attempt a rewind failed: no txid failed it (never counted as its own
failure, and no failure sensor re-queues it: the rewind restarts the runs)."""


def rewind_floor(pruned_through: int, undo_from: int) -> int:
    """The oldest txid a rewind can go back to: its commit and every later one wrote undo
    records (``undo_from``), and the txid before it still has its row, whose metadata is where
    an opaque replay starts (retention pruned every txid up to ``pruned_through``)."""
    return max(undo_from, pruned_through + 2 if pruned_through else 1)


@dataclass(frozen=True)
class RewindPlan:
    to_txid: int
    rolled_back: range
    """Committed txids whose commits are undone (empty when rewinding to the oldest uncommitted
    txid)."""
    failed: tuple[int, ...]
    """Every txid from ``to_txid`` on whose current attempt becomes failed: the rolled back
    ones and those in flight. Each replays with a new attempt, which fences the old one."""

    @property
    def last_committed(self) -> int:
        """The pipeline's last committed txid after the rewind."""
        return self.to_txid - 1


def plan_rewind(view: PipelineView, to_txid: int, *, floor: int) -> RewindPlan:
    """Rewinding ``view``'s pipeline to ``to_txid``: the commits of ``to_txid`` and later are
    undone and every txid from ``to_txid`` on is pending again, to be recomputed in order.

    ``floor`` (:func:`rewind_floor`) is the oldest txid that can be restored exactly; below it is
    :class:`RewindTooFarError`. A txid after the oldest uncommitted one has nothing committed to
    roll back: :class:`RewindAheadError`."""
    p = view.pipeline
    if to_txid < floor:
        raise RewindTooFarError(
            f"cannot rewind to txid {to_txid}: the oldest txid this log can restore exactly is "
            f"{floor} (retention keeps undo records and txids for its keep_txids newest "
            "committed txids; a version without undo records committed the ones before)",
            pipeline=p,
            txid=to_txid,
            floor=str(floor),
        )
    if to_txid > view.oldest_uncommitted:
        raise RewindAheadError(
            f"cannot rewind to txid {to_txid}: the last committed txid is {view.last_committed}",
            pipeline=p,
            txid=to_txid,
        )
    failed = tuple(range(to_txid, view.last_committed + 1)) + tuple(r.txid for r in view.in_flight)
    return RewindPlan(to_txid, range(to_txid, view.last_committed + 1), failed)


def rewound_through(rewinds: Iterable[tuple[int, int]]) -> int:
    """The newest txid whose attempt a rewind failed, of ``rewinds``' ``(to_txid, how many
    txids it failed)`` (they are consecutive from ``to_txid``; 0: none): a lake table's commit of
    a txid up to it, ahead of the log, is one a rewind undid (:func:`plan_sink_commit`)."""
    return max((to + n - 1 for to, n in rewinds if n), default=0)


def airflow_runs_prune_due(committed: Sequence[int]) -> bool:
    """Whether a task that committed the txids ``committed`` prunes Airflow's DAG runs: when one
    of them is a multiple of ``PRUNE_EVERY``. The rule for DAG runs, kept apart from the log's own
    (:func:`~airflow_txn_provider.rules.history.prune_range`, from where it pruned last): a task
    does not know where the last prune of the runs stopped."""
    return any(t % PRUNE_EVERY == 0 for t in committed)
