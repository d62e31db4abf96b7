"""Filling an output from history: the rules, pure.

An output declared ``start={name: "history"}``
(:class:`~airflow_txn_provider.rules.vocabulary.OutputStart`) records ``live_from``, the first
txid to begin after it: from there the live processing stages its rows, which the live commits
leave waiting (:func:`~airflow_txn_provider.rules.outputs.skipped_at_commit`). A fill applies the
committed txids in order (:func:`next_step`), computed by its own jobs below ``live_from``
(:attr:`Step.COMPUTE`), from the staged rows from it on (:attr:`Step.APPLY_STAGED`), its progress
fenced by its attempt; then it joins the live commits under the pipeline's lock (:func:`join_gap`),
complete from txid 1. Only a source that re-reads a batch exactly may fill (:func:`refuse_fill`);
retention keeps what a fill needs (:func:`retention_floor`); a rewind takes its progress back
(:func:`rewound_progress`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from airflow_txn_provider.rules.vocabulary import SourceKind

FILL_CHUNK = 25
"""Txids one fill job computes at once: one Spark job reads and transforms each of their batches
(kept apart by txid), and one Postgres transaction applies them in order. Memory is bounded by a
chunk's results, not by history."""

JOIN_GAP = 2
"""The most committed txids the join applies under the pipeline's lock (staged rows only): more,
and it lets go of the lock and applies them outside first, so a live commit waits for no more
than about one commit's work."""


@dataclass(frozen=True)
class FillProgress:
    """One filling output's progress, as ``txn_output`` records it."""

    output: str
    live_from: int
    """The first txid begun after the declaration: processed with the output, its rows staged."""
    filled_through: int = 0
    """The newest txid applied to the output, in txid order (0: none)."""
    attempt: int = 0
    """The fill's fencing token."""
    joined_after: int | None = None
    """The last committed txid when it joined (``None``: filling)."""

    @property
    def filling(self) -> bool:
        return self.joined_after is None


class Step(Enum):
    COMPUTE = "compute"
    """Compute ``first..last`` with the fill's own jobs over their recorded batches."""
    APPLY_STAGED = "apply_staged"
    """Apply the rows the live processing staged for ``first..last``."""
    JOIN = "join"
    """Every committed txid is applied: join the live commits (under the pipeline's lock)."""
    WAIT = "wait"
    """A txid begun before the declaration is still in flight (processed without the output):
    once it commits, the fill computes it."""
    DONE = "done"
    """Joined already."""


@dataclass(frozen=True)
class FillStep:
    step: Step
    first: int = 0
    last: int = 0

    @property
    def txids(self) -> range:
        return range(self.first, self.last + 1)


def next_step(progress: FillProgress, last_committed: int, *, chunk: int = FILL_CHUNK) -> FillStep:
    """What the fill of ``progress`` does next, the pipeline's last committed txid being
    ``last_committed``: the next txids in order (at most ``chunk``), the join, a wait or nothing."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if not progress.filling:
        return FillStep(Step.DONE)
    first = progress.filled_through + 1
    if first > last_committed:
        # Joining now is exact only if every txid after the last committed one stages the
        # output: those begun after the declaration. One begun before must commit first.
        if last_committed >= progress.live_from - 1:
            return FillStep(Step.JOIN)
        return FillStep(Step.WAIT)
    if first < progress.live_from:
        last = min(progress.live_from - 1, last_committed, first + chunk - 1)
        return FillStep(Step.COMPUTE, first, last)
    return FillStep(Step.APPLY_STAGED, first, min(last_committed, first + chunk - 1))


def join_gap(progress: FillProgress, last_committed: int) -> range | None:
    """Under the pipeline's lock (no commit moves ``last_committed`` meanwhile): the committed
    txids the join applies from their staged rows before it joins, or ``None`` when it must not
    join now (more than :data:`JOIN_GAP` of them, or one computed by the fill's own jobs only)."""
    if not progress.filling:
        return None
    gap = range(progress.filled_through + 1, last_committed + 1)
    if len(gap) > JOIN_GAP or (gap and gap.start < progress.live_from):
        return None
    if last_committed < progress.live_from - 1:
        return None
    return gap


def fill_share(progress: FillProgress, last_committed: int) -> float:
    """How much of the history the output holds, 0..1: its applied txids of the committed ones
    (1 once joined)."""
    if not progress.filling:
        return 1.0
    if last_committed <= 0:
        return 0.0
    return min(1.0, progress.filled_through / last_committed)


def describe(progress: FillProgress, last_committed: int) -> str:
    """The page's sentence for a filling output."""
    if not progress.filling:
        return (
            "complete from txid 1 (filled from history, joined the live commits after txid "
            f"{progress.joined_after})"
        )
    share = fill_share(progress, last_committed)
    return (
        f"filling: {int(share * 100)} % of history (txids 1..{progress.filled_through} of "
        f"{last_committed} committed)"
    )


def refuse_fill(
    source_kind: SourceKind, *, replays_exactly: bool, pruned_through: int
) -> str | None:
    """Why an output cannot be filled from history now (``None``: it can): a source whose replay
    may read other records than the committed batch (an opaque one that does not declare exact
    replays), or history pruned by retention (its batches' metadata are gone)."""
    if source_kind is SourceKind.OPAQUE and not replays_exactly:
        return (
            "its source is opaque: a replay of a committed txid may read other records than the "
            "ones it committed, so a fill would not equal what the output would hold. Declare "
            'start="next_txid", or rewind the pipeline to txid 1 to recompute every output'
        )
    if pruned_through > 0:
        return (
            f"retention pruned txids 1..{pruned_through} (their batches' metadata are gone): "
            f"history can be filled back to txid {pruned_through + 1} only, short of txid 1. "
            'Declare start="next_txid" (complete from the next txid), or raise keep_txids '
            "before the history you need is pruned"
        )
    return None


def retention_floor(progresses: Iterable[FillProgress]) -> int | None:
    """The oldest txid whose row a filling output still needs (its next txid to apply), or
    ``None``: retention prunes nothing from it on."""
    needed = [p.filled_through + 1 for p in progresses if p.filling]
    return min(needed, default=None)


def rewound_progress(progress: FillProgress, to_txid: int) -> FillProgress:
    """The progress after a rewind to ``to_txid``: the rewind took the output back to its value
    after ``to_txid - 1`` with the other states (its undo records), so the fill resumes there.
    A joined output is rewound as every other one; its record stays."""
    if not progress.filling or progress.filled_through < to_txid:
        return progress
    return FillProgress(
        progress.output,
        progress.live_from,
        to_txid - 1,
        progress.attempt,
        progress.joined_after,
    )


__all__ = [
    "FILL_CHUNK",
    "JOIN_GAP",
    "FillProgress",
    "FillStep",
    "Step",
    "describe",
    "fill_share",
    "join_gap",
    "next_step",
    "refuse_fill",
    "retention_floor",
    "rewound_progress",
]
