"""The history rules with plain values: retention (prune_range) and the rewind (plan_rewind,
rewind_floor); the rewind on a real Postgres and Spark is
tests/integration/transactions/test_rewind.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_txn_provider.rules.config import validate_keep_txids
from airflow_txn_provider.rules.coordinator import next_to_begin, plan_begin
from airflow_txn_provider.rules.exceptions import RewindAheadError, RewindTooFarError
from airflow_txn_provider.rules.history import (
    REWOUND_BY,
    plan_rewind,
    prune_range,
    retention_horizon,
    rewind_floor,
    rewound_through,
)
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import BeginAction, SourceKind
from tests.unit.builders import DONE, FAIL, PROC, view


def test_the_floor_is_where_undo_records_start_and_the_txid_before_is_kept():
    assert rewind_floor(0, 1) == 1  # nothing pruned: back to txid 1
    assert rewind_floor(0, 40) == 40  # committed up to 39 by a version without undo records
    # retention pruned up to 100: txid 101 is kept, so a replay of 102 knows where to start
    assert rewind_floor(100, 1) == 102
    assert rewind_floor(100, 500) == 500


def test_a_rewind_rolls_back_the_committed_txids_and_fails_those_in_flight():
    v = view((11, 1, DONE), (12, 2, PROC), (13, 1, FAIL), last=10)
    plan = plan_rewind(v, 7, floor=1)
    assert plan.rolled_back == range(7, 11)
    assert plan.failed == (7, 8, 9, 10, 11, 12, 13)
    assert plan.last_committed == 6


def test_rewinding_to_the_oldest_uncommitted_txid_rolls_nothing_back():
    v = view((4, 1, PROC), last=3)
    plan = plan_rewind(v, 4, floor=1)
    assert plan.rolled_back == range(4, 4) and plan.failed == (4,)
    assert plan_rewind(view(last=3), 4, floor=1).failed == ()


def test_below_the_floor_is_refused_saying_how_far_back_is_possible():
    with pytest.raises(RewindTooFarError) as raised:
        plan_rewind(view(last=300), 150, floor=201)
    err = raised.value
    assert (err.pipeline, err.txid, err.floor) == ("p", 150, "201")
    assert "oldest txid this log can restore exactly is 201" in str(err)


def test_past_the_oldest_uncommitted_txid_is_refused():
    with pytest.raises(RewindAheadError, match="last committed txid is 5"):
        plan_rewind(view((6, 1, PROC), last=5), 7, floor=1)


@given(
    last=st.integers(0, 50),
    in_flight=st.integers(0, 6),
    data=st.data(),
)
def test_after_a_rewind_the_txids_replay_in_order_from_n_with_new_attempts(last, in_flight, data):
    """What the log holds after a rewind is a view the begin rules replay from N, in order,
    each attempt one more than the rewound one (the fence), and nothing else first."""
    to = data.draw(st.integers(1, last + 1))
    v = view(*((last + i, 1, PROC) for i in range(1, in_flight + 1)), last=last)
    plan = plan_rewind(v, to, floor=1)
    assert plan.failed == tuple(range(to, last + in_flight + 1))
    # the log's writes: every txid from N failed (attempt kept), last committed N - 1
    after = type(v)(
        pipeline="p",
        source_kind=SourceKind.OPAQUE,
        max_pending=4,
        last_committed=plan.last_committed,
        in_flight=tuple(TxRecord(t, 2, FAIL, failed_by=REWOUND_BY) for t in plan.failed),
    )
    if plan.failed:
        assert next_to_begin(after) == to
        begin = plan_begin(after, to)
        assert begin.action is BeginAction.REPLAY and begin.attempt == 3
        assert not begin.reuse_metadata  # opaque: read again from where N - 1 ended
        for later in plan.failed[1:]:
            assert plan_begin(after, later).action is BeginAction.WAIT_PREVIOUS
    # a rewound attempt is never its own failure: no poison-batch count, no sensor's re-queue
    assert all(not r.failed_on_its_own for r in after.in_flight)


def test_the_newest_txid_a_rewind_undid_spans_every_rewind():
    assert rewound_through([]) == 0
    # to 5, failing 5..9; then to 3, failing 3..6 (the replays had reached 6); then a rewind
    # that failed nothing (to the oldest uncommitted txid, none begun)
    assert rewound_through([(5, 5), (3, 4), (7, 0)]) == 9
    assert rewound_through([(3, 4)]) == 6


class TestRetention:
    def test_horizon_keeps_the_newest_committed_txids(self):
        assert retention_horizon(0, 1000) == 0
        assert retention_horizon(999, 1000) == 0
        assert retention_horizon(1500, 1000) == 500
        assert retention_horizon(10, 1) == 9  # the last committed txid is always kept

    def test_prune_range_is_bounded_and_starts_after_what_was_pruned(self):
        assert prune_range(2000, 1000, 0, batch=300) == range(1, 301)
        assert prune_range(2000, 1000, 300, batch=300) == range(301, 601)
        assert prune_range(2000, 1000, 900, batch=300) == range(901, 1001)
        assert prune_range(2000, 1000, 1000, batch=300) == range(0)  # idempotent: nothing left

    def test_prune_range_waits_until_enough_are_due(self):
        assert prune_range(1015, 1000, 0, every=16) == range(0)
        assert prune_range(1016, 1000, 0, every=16) == range(1, 17)

    def test_a_larger_keep_after_pruning_prunes_nothing(self):
        assert prune_range(2000, 1900, 500) == range(0)

    @given(
        last=st.integers(0, 5000),
        keep=st.integers(1, 2000),
        pruned=st.integers(0, 5000),
        batch=st.integers(1, 600),
        every=st.integers(1, 50),
    )
    def test_never_prunes_the_last_committed_txid_nor_anything_newer(
        self, last, keep, pruned, batch, every
    ):
        due = prune_range(last, keep, pruned, batch=batch, every=every)
        assert len(due) <= batch
        assert all(pruned < t <= last - keep < last for t in due)

    @pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
    def test_keep_txids_must_be_positive_int(self, bad):
        with pytest.raises(ValueError, match="keep_txids"):
            validate_keep_txids(bad)
