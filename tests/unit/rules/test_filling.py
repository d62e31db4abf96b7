"""The fill-from-history rules (rules/filling.py), pure: what a fill does next, when it may join,
what retention keeps for it, how a rewind moves it, and when a fill is refused. A model of a fill
beside a live pipeline checks the rules together: whatever the interleaving of commits, fill steps
and rewinds, the output ends up applied exactly once per committed txid, in txid order."""

from __future__ import annotations

import random

import pytest

from airflow_txn_provider.rules.filling import (
    JOIN_GAP,
    FillProgress,
    FillStep,
    Step,
    describe,
    fill_share,
    join_gap,
    next_step,
    refuse_fill,
    retention_floor,
    rewound_progress,
)
from airflow_txn_provider.rules.vocabulary import SourceKind


def at(through: int, live_from: int = 10, joined: int | None = None) -> FillProgress:
    return FillProgress("out", live_from, through, 1, joined)


@pytest.mark.parametrize(
    ("progress", "last", "expected"),
    [
        (at(0), 9, FillStep(Step.COMPUTE, 1, 4)),
        (at(4), 9, FillStep(Step.COMPUTE, 5, 8)),
        (at(8), 9, FillStep(Step.COMPUTE, 9, 9)),  # never past live_from - 1
        (at(0), 2, FillStep(Step.COMPUTE, 1, 2)),  # never past the last committed
        (at(9), 15, FillStep(Step.APPLY_STAGED, 10, 13)),
        (at(13), 15, FillStep(Step.APPLY_STAGED, 14, 15)),
        (at(15), 15, FillStep(Step.JOIN)),
        (at(9), 9, FillStep(Step.JOIN)),  # nothing begun after the declaration committed yet
        (at(3), 3, FillStep(Step.WAIT)),  # txids 4..9 begun before it, in flight: wait
        (at(15, joined=15), 20, FillStep(Step.DONE)),
    ],
)
def test_next_step(progress, last, expected):
    assert next_step(progress, last, chunk=4) == expected


def test_a_chunk_is_at_least_one_txid():
    with pytest.raises(ValueError, match="chunk"):
        next_step(at(0), 5, chunk=0)


def test_the_join_applies_a_short_gap_of_staged_txids_only():
    assert join_gap(at(12), 12) == range(13, 13)
    assert join_gap(at(12), 12 + JOIN_GAP) == range(13, 13 + JOIN_GAP)
    assert join_gap(at(12), 13 + JOIN_GAP) is None  # too many under the lock: outside first
    assert join_gap(at(8), 10) is None  # txid 9 is computed by the fill's own jobs
    assert join_gap(at(3), 3) is None  # txids begun before the declaration still in flight
    assert join_gap(at(5, joined=5), 5) is None


def test_share_and_sentence():
    assert fill_share(at(2), 8) == 0.25
    assert fill_share(at(0), 0) == 0.0
    assert fill_share(at(5, joined=5), 9) == 1.0
    assert describe(at(2), 8) == "filling: 25 % of history (txids 1..2 of 8 committed)"
    assert "joined the live commits after txid 5" in describe(at(5, joined=5), 9)


def test_retention_keeps_what_the_slowest_fill_needs():
    assert retention_floor([]) is None
    assert retention_floor([at(7), at(3), at(1, joined=1)]) == 4


def test_a_rewind_takes_the_progress_back_only_past_it():
    assert rewound_progress(at(8), 5) == at(4)
    assert rewound_progress(at(8), 9) == at(8)
    assert rewound_progress(at(8, joined=8), 5) == at(8, joined=8)


def test_refusals_name_why_and_how_far_back():
    assert refuse_fill(SourceKind.TRANSACTIONAL, replays_exactly=True, pruned_through=0) is None
    assert refuse_fill(SourceKind.OPAQUE, replays_exactly=True, pruned_through=0) is None
    opaque = refuse_fill(SourceKind.OPAQUE, replays_exactly=False, pruned_through=0)
    assert opaque is not None and "opaque" in opaque
    pruned = refuse_fill(SourceKind.TRANSACTIONAL, replays_exactly=True, pruned_through=6)
    assert pruned is not None and "back to txid 7 only" in pruned


@pytest.mark.parametrize("seed", range(40))
def test_a_fill_beside_live_commits_and_rewinds_applies_each_txid_once_in_order(seed):
    """A model: the live pipeline commits (the declaration at ``live_from``), a fill follows the
    rules, rewinds come at random. The output's applied txids are recorded as the fill and the
    live commits apply them; at the end they must be exactly 1..last committed, in order."""
    rng = random.Random(seed)
    print("seed", seed)
    live_from = rng.randint(1, 12)
    last = live_from - 1 - rng.randint(0, min(3, live_from - 1))  # some begun before, in flight
    progress = FillProgress("out", live_from, 0, 1)
    applied: list[int] = []  # the output's txids, in the order applied
    for _ in range(400):
        action = rng.random()
        if action < 0.4 and last < 60:  # a live commit
            last += 1
            if not progress.filling:
                applied.append(last)
        elif action < 0.45 and last > 0:  # a rewind to a committed txid
            to = rng.randint(max(1, last - 5), last)
            applied = [t for t in applied if t < to]  # the states' undo records
            progress = rewound_progress(progress, to)
            last = to - 1
        elif progress.filling:
            step = next_step(progress, last, chunk=rng.randint(1, 5))
            if step.step in (Step.COMPUTE, Step.APPLY_STAGED):
                assert step.first == progress.filled_through + 1
                applied += list(step.txids)
                progress = FillProgress("out", live_from, step.last, 1)
            elif step.step is Step.JOIN:
                gap = join_gap(progress, last)
                assert gap is not None
                applied += list(gap)
                progress = FillProgress("out", live_from, last, 1, last)
        assert applied == list(range(1, len(applied) + 1)), (seed, applied)
    # whatever is left: the fill runs to its join
    while progress.filling:
        step = next_step(progress, last)
        if step.step is Step.WAIT:
            last += 1  # the txids begun before the declaration commit
            continue
        if step.step is Step.JOIN:
            progress = FillProgress("out", live_from, last, 1, last)
            continue
        applied += list(step.txids)
        progress = FillProgress("out", live_from, step.last, 1)
    assert applied == list(range(1, last + 1))
