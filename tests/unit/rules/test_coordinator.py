"""The coordinator rules with plain values: window, begin, commit, failure, recovery, a lease's
expiry (the attempt fence's own rules, a processed report among them: test_fencing.py; the
snapshot's invariants: test_records.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_txn_provider.rules.config import validate_max_pending
from airflow_txn_provider.rules.coordinator import (
    committable,
    expired_lease,
    next_to_begin,
    plan_begin,
    plan_commit,
    plan_expiry,
    plan_failure,
    plan_recovery,
)
from airflow_txn_provider.rules.exceptions import (
    NotBegunError,
    NotProcessedError,
    OutOfOrderCommitError,
    StaleAttemptError,
)
from airflow_txn_provider.rules.fencing import lease_expired
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import (
    BeginAction,
    CommitAction,
    SourceKind,
)
from tests.unit.builders import DONE, FAIL, NOW, PROC, leased, view


class TestLease:
    def test_expiry_fails_the_txid_and_every_later_one_in_flight(self):
        v = leased(((1, 1, DONE, None), (2, 2, PROC, -5), (3, 1, PROC, 20), (4, 1, FAIL, None)))
        assert plan_expiry(v, 2, 2) == (2, 3)
        assert expired_lease(v) == v.record(2)

    def test_expiry_fails_nothing_while_alive_or_for_an_old_attempt(self):
        v = leased(((1, 2, PROC, 10), (2, 1, PROC, -5)))
        assert plan_expiry(v, 1, 2) == ()  # alive
        assert plan_expiry(v, 2, 1) == (2,)
        assert plan_expiry(v, 2, 2) == ()  # not the current attempt: never emitted
        assert plan_expiry(v, 9, 1) == ()  # never begun
        assert expired_lease(leased(((1, 1, PROC, 10),))) is None

    @given(
        leases=st.lists(
            st.one_of(st.none(), st.floats(-100, 100, allow_nan=False)), min_size=1, max_size=6
        ),
        statuses=st.lists(st.sampled_from([PROC, DONE, FAIL]), min_size=6, max_size=6),
    )
    def test_expiry_agrees_with_the_failure_rule(self, leases, statuses):
        recs = tuple((i + 1, 1, statuses[i], secs) for i, secs in enumerate(leases))
        v = leased(recs)
        first = expired_lease(v)
        for rec in v.in_flight:
            got = plan_expiry(v, rec.txid, rec.attempt)
            if lease_expired(rec, NOW):
                assert got == plan_failure(v, rec.txid, rec.attempt) and got[0] == rec.txid
                assert first is not None and first.txid <= rec.txid
            else:
                assert got == ()
        if first is None:
            assert not any(lease_expired(r, NOW) for r in v.in_flight)


class TestBegin:
    def test_first_txid_is_new_with_no_previous_metadata(self):
        plan = plan_begin(view(), 1)
        assert plan.action is BeginAction.NEW and plan.attempt == 1
        assert plan.prev_metadata is None and plan.emits

    def test_new_txid_gets_previous_metadata(self):
        plan = plan_begin(view((1, 1, PROC)), 2)
        assert plan.action is BeginAction.NEW and plan.prev_metadata == {"end": 10}

    def test_new_txid_waits_for_previous_to_begin(self):
        # STORM-1557: txid 3 must not initialise metadata before txid 2 did.
        assert plan_begin(view((1, 1, PROC)), 3).action is BeginAction.WAIT_PREVIOUS

    def test_window_is_max_pending_wide(self):
        v = view((1, 1, PROC), (2, 1, DONE), (3, 1, PROC), (4, 1, PROC), max_pending=4)
        assert plan_begin(v, 5).action is BeginAction.WAIT_WINDOW
        v = view((2, 1, PROC), (3, 1, PROC), (4, 1, PROC), last=1, max_pending=4)
        assert plan_begin(v, 5).action is BeginAction.NEW

    def test_committed_txid_is_a_noop(self):
        plan = plan_begin(view(last=3), 2)
        assert plan.action is BeginAction.ALREADY_COMMITTED and not plan.emits

    def test_failed_transactional_txid_replays_stored_metadata(self):
        plan = plan_begin(view((1, 2, FAIL)), 1)
        assert plan.action is BeginAction.REPLAY and plan.attempt == 3 and plan.reuse_metadata

    def test_failed_opaque_txid_recomputes_from_previous(self):
        v = view((2, 1, FAIL), last=1, kind=SourceKind.OPAQUE)
        plan = plan_begin(v, 2)
        assert plan.action is BeginAction.REPLAY and not plan.reuse_metadata
        assert plan.prev_metadata == {"end": 10}

    def test_a_begin_that_may_not_replay_leaves_a_failed_txid_alone(self):
        """An Airflow retry of a claim: the failure sensor answers the failure (replay or stop),
        so the retry adds no attempt (CI: a poison batch got a third attempt, max_attempts=2)."""
        plan = plan_begin(view((1, 2, FAIL)), 1, replay=False)
        assert (plan.action, plan.attempt, plan.emits) == (BeginAction.NOT_REPLAYED, None, False)
        # what it may still do: resume a live attempt, begin a new txid, see a commit
        assert plan_begin(view((1, 2, PROC)), 1, replay=False).action is BeginAction.RESUME
        assert plan_begin(view((1, 1, PROC)), 2, replay=False).action is BeginAction.NEW
        assert plan_begin(view(last=3), 2, replay=False).action is BeginAction.ALREADY_COMMITTED

    def test_replay_waits_for_earlier_failed_txid(self):
        v = view((1, 1, FAIL), (2, 1, FAIL))
        assert plan_begin(v, 2).action is BeginAction.WAIT_PREVIOUS
        assert plan_begin(v, 1).action is BeginAction.REPLAY

    def test_begin_of_a_live_attempt_resumes_it(self):
        """A retried or duplicated begin hands out what its first try claimed: never re-emits."""
        for status in (PROC, DONE):
            v = view((1, 1, PROC), (2, 3, status), (3, 1, PROC))
            plan = plan_begin(v, 2)
            assert (plan.action, plan.attempt, plan.invalidate) == (BeginAction.RESUME, 3, ())
            assert not plan.emits

    def test_begin_after_the_lease_ran_out_reemits_and_invalidates_later(self):
        v = leased(((1, 1, PROC, 0), (2, 1, PROC, -1), (3, 1, DONE, None), (4, 1, PROC, 50)))
        plan = plan_begin(v, 2)
        assert plan.action is BeginAction.REEMIT and plan.attempt == 2
        assert plan.invalidate == (2, 3, 4)
        assert plan_begin(v, 4).action is BeginAction.RESUME  # its lease is alive

    def test_bad_txid(self):
        with pytest.raises(ValueError):
            plan_begin(view(), 0)

    def test_next_to_begin_prefers_oldest_failed(self):
        assert next_to_begin(view((1, 1, DONE), (2, 1, FAIL), (3, 1, FAIL))) == 2
        assert next_to_begin(view((1, 1, DONE))) == 2
        full = view((1, 1, PROC), (2, 1, PROC), max_pending=2)
        assert next_to_begin(full) is None


class TestCommit:
    def test_oldest_processed_current_attempt_commits(self):
        assert plan_commit(view((1, 1, DONE)), 1, 1) is CommitAction.APPLY
        assert committable(view((1, 1, DONE))) == TxRecord(1, 1, DONE, {"end": 10}, {"n": 1})

    def test_out_of_order_commit_is_refused(self):
        v = view((1, 1, PROC), (2, 1, DONE))
        with pytest.raises(OutOfOrderCommitError) as err:
            plan_commit(v, 2, 1)
        assert (err.value.txid, err.value.attempt) == (2, 1)
        assert committable(v) is None

    def test_stale_attempt_is_refused(self):
        with pytest.raises(StaleAttemptError):
            plan_commit(view((1, 2, DONE)), 1, 1)
        with pytest.raises(StaleAttemptError):
            plan_commit(view((1, 1, FAIL)), 1, 1)

    def test_commit_without_processed_output_is_refused(self):
        with pytest.raises(NotProcessedError):
            plan_commit(view((1, 1, PROC)), 1, 1)

    def test_committed_txid_commit_is_idempotent(self):
        assert plan_commit(view(last=1), 1, 1) is CommitAction.ALREADY_COMMITTED

    def test_never_begun(self):
        with pytest.raises(NotBegunError):
            plan_commit(view(), 1, 1)


class TestFailure:
    def test_storm_scenario_fail_2_of_4_reemits_2_3_4_and_leaves_1(self):
        v = view((1, 1, DONE), (2, 1, PROC), (3, 1, DONE), (4, 1, PROC))
        assert plan_failure(v, 2, 1) == (2, 3, 4)

    def test_late_failure_of_old_attempt_fails_nothing(self):
        v = view((1, 1, DONE), (2, 2, PROC), (3, 1, PROC))
        assert plan_failure(v, 2, 1) == ()

    def test_failure_of_committed_txid_fails_nothing(self):
        assert plan_failure(view((2, 1, PROC), last=1), 1, 1) == ()

    def test_already_failed_txids_are_not_failed_again(self):
        v = view((1, 1, PROC), (2, 1, FAIL), (3, 1, FAIL))
        assert plan_failure(v, 1) == (1,)

    def test_failure_of_unknown_txid(self):
        with pytest.raises(NotBegunError):
            plan_failure(view(), 3)

    def test_a_processing_failure_after_the_output_was_recorded_keeps_it(self):
        # spark-submit exiting non-zero at shutdown, a task failing after its job recorded the
        # output: the processed attempt stands, nothing is failed, nothing counts as poison.
        v = view((1, 1, DONE), (2, 1, PROC))
        assert plan_failure(v, 1, 1, of_processing=True) == ()
        assert plan_failure(v, 1, None, of_processing=True) == ()
        # Still processing: it and every later txid fail, as any failure does.
        assert plan_failure(view((1, 1, PROC), (2, 1, DONE)), 1, 1, of_processing=True) == (1, 2)

    def test_a_stopped_try_whose_lease_another_took_over_fails_nothing(self):
        # Airflow stopped try 1 of a processing task while try 2 had resumed the same attempt
        # and renewed its lease: try 1's bad exit must not fail the attempt try 2 is processing.
        v = view((1, 1, PROC), (2, 1, PROC))
        held = dataclasses.replace(v.in_flight[0], lease_holder="task p (try 2) (host h, pid 2)")
        v = dataclasses.replace(v, in_flight=(held, v.in_flight[1]))
        try_1, try_2 = "task p (try 1) (host h, pid 1)", "task p (try 2) (host h, pid 2)"
        assert plan_failure(v, 1, 1, of_processing=True, reporter=try_1) == ()
        assert plan_failure(v, 1, 1, of_processing=True, reporter=try_2) == (1, 2)
        # no holder recorded yet (never renewed), or a report naming no reporter: as before
        assert plan_failure(view((1, 1, PROC)), 1, 1, of_processing=True, reporter=try_1) == (1,)
        assert plan_failure(v, 1, 1, of_processing=True) == (1, 2)
        # a holder name is stored cut to its column's width: a long reporter still matches
        long = "t" * 600
        cut = dataclasses.replace(
            v, in_flight=(dataclasses.replace(held, lease_holder=long[:500]),)
        )
        assert plan_failure(cut, 1, 1, of_processing=True, reporter=long) == (1,)

    def test_a_failed_commit_or_a_cascade_fails_a_processed_txid(self):
        v = view((1, 1, PROC), (2, 1, DONE), (3, 1, DONE))
        assert plan_failure(v, 2, 1) == (2, 3)  # its commit failed
        assert plan_failure(v, 1, 1, of_processing=True) == (1, 2, 3)  # the cascade of txid 1

    @given(
        st.lists(st.sampled_from([PROC, DONE, FAIL]), min_size=1, max_size=6),
        st.integers(1, 6),
    )
    def test_a_processing_failure_fails_what_a_failure_does_but_a_processed_origin(
        self, statuses, txid
    ):
        v = view(*((t, 1, s) for t, s in enumerate(statuses, start=1)))
        if txid > len(statuses):
            return
        general = plan_failure(v, txid, 1)
        processing = plan_failure(v, txid, 1, of_processing=True)
        assert processing == (() if statuses[txid - 1] is DONE else general)

    def test_recovery_fails_from_oldest_processing(self):
        v = view((1, 1, DONE), (2, 1, PROC), (3, 1, DONE), (4, 1, FAIL))
        assert plan_recovery(v) == (2, 3)
        assert plan_recovery(view((1, 1, DONE), (2, 1, DONE))) == ()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4", True])
def test_max_pending_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="max_pending"):
        validate_max_pending(bad)
