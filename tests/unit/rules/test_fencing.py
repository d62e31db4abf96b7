"""The attempt fence with plain values (rules/fencing.py): a lease that ran out, a claim's
timeout, a renewal's answer, and which processed reports count."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from airflow_txn_provider.rules.exceptions import ConflictingOutputError, NotBegunError
from airflow_txn_provider.rules.fencing import (
    CLAIM_BACKOFF_LIMIT,
    attempt_may_stage,
    claim_timeout_for,
    lease_expired,
    lease_renewal,
    plan_processed,
)
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import LeaseRenewal, ProcessedAction, TxStatus
from tests.unit.builders import DONE, FAIL, NOW, PROC, leased, view


class TestLease:
    def test_only_a_processing_attempt_past_its_lease_is_expired(self):
        v = leased(((1, 1, PROC, -0.001), (2, 1, PROC, 0), (3, 1, PROC, 0.001), (4, 1, DONE, -9)))
        assert [lease_expired(r, v.now) for r in v.in_flight] == [True, True, False, False]
        assert not lease_expired(TxRecord(1, 1, FAIL, lease_expires_at=NOW), NOW)
        assert not lease_expired(TxRecord(1, 1, PROC), NOW)  # no lease recorded: never expires
        assert not lease_expired(TxRecord(1, 1, PROC, lease_expires_at=NOW), None)  # no clock

    def test_a_claim_that_ran_out_before_its_processing_started_doubles_the_next_one(self):
        def expired_unstarted(claimed: float, **changes: object) -> TxRecord:
            rec = TxRecord(1, 1, FAIL, failed_by=1, begun_at=NOW)
            rec = dataclasses.replace(rec, lease_expires_at=NOW + timedelta(seconds=claimed))
            return dataclasses.replace(rec, **changes)  # type: ignore[arg-type]

        assert claim_timeout_for(None, 20) == 20  # a new txid
        assert claim_timeout_for(expired_unstarted(20), 20) == 40
        assert claim_timeout_for(expired_unstarted(40), 20) == 80  # again: doubled again
        assert claim_timeout_for(expired_unstarted(150), 20) == 20 * CLAIM_BACKOFF_LIMIT
        assert claim_timeout_for(expired_unstarted(5), 20) == 20  # never below the caller's
        # its processing had started (it renewed the lease): it died, it was not slow to start
        assert claim_timeout_for(expired_unstarted(20, lease_holder="w (pid 1)"), 20) == 20
        # failed with an earlier txid, or not failed at all: nothing to learn from its claim
        assert claim_timeout_for(expired_unstarted(20, txid=2), 20) == 20
        assert claim_timeout_for(expired_unstarted(20, status=PROC, failed_by=None), 20) == 20
        assert claim_timeout_for(expired_unstarted(20, begun_at=None), 20) == 20

    def test_a_renewal_renews_while_processing_and_stops_a_failed_or_replaced_attempt(self):
        assert lease_renewal(TxRecord(1, 2, PROC), 2) is LeaseRenewal.RENEWED
        assert lease_renewal(TxRecord(1, 2, FAIL), 2) is LeaseRenewal.LOST
        assert lease_renewal(TxRecord(1, 3, PROC), 2) is LeaseRenewal.LOST  # replaced
        assert lease_renewal(None, 1) is LeaseRenewal.LOST

    def test_a_renewal_after_the_output_is_recorded_is_done_not_lost(self):
        """A job whose output is recorded may still be stopping Spark: stopping it then would
        fail a finished attempt and its cascade."""
        assert lease_renewal(TxRecord(1, 2, DONE), 2) is LeaseRenewal.DONE
        assert lease_renewal(TxRecord(1, 2, TxStatus.COMMITTED), 2) is LeaseRenewal.DONE
        assert lease_renewal(TxRecord(1, 3, DONE), 2) is LeaseRenewal.LOST  # another's output


class TestProcessed:
    def test_current_attempt_is_accepted(self):
        v = view((1, 1, PROC))
        assert plan_processed(v.record(1), pipeline="p", txid=1, attempt=1, output={"n": 1}) is (
            ProcessedAction.ACCEPT
        )

    def test_late_report_from_old_attempt_is_ignored(self):
        v = view((1, 2, PROC))
        action = plan_processed(v.record(1), pipeline="p", txid=1, attempt=1, output={})
        assert action is ProcessedAction.IGNORE_STALE

    def test_report_from_failed_attempt_is_ignored(self):
        v = view((1, 1, FAIL))
        action = plan_processed(v.record(1), pipeline="p", txid=1, attempt=1, output={})
        assert action is ProcessedAction.IGNORE_STALE

    def test_duplicate_report_is_a_noop_and_conflict_is_an_error(self):
        rec = TxRecord(1, 1, DONE, output={"n": 5})
        assert plan_processed(rec, pipeline="p", txid=1, attempt=1, output={"n": 5}) is (
            ProcessedAction.DUPLICATE
        )
        with pytest.raises(ConflictingOutputError) as err:
            plan_processed(rec, pipeline="p", txid=1, attempt=1, output={"n": 6})
        assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 1, 1)

    def test_unknown_txid_or_future_attempt(self):
        with pytest.raises(NotBegunError):
            plan_processed(None, pipeline="p", txid=9, attempt=1, output=None)
        with pytest.raises(NotBegunError, match="never emitted"):
            plan_processed(TxRecord(1, 1, PROC), pipeline="p", txid=1, attempt=2, output=None)

    def test_a_late_report_of_a_txid_pruned_since_is_stale_not_unknown(self):
        """Found by the log's state machine: txid 1 committed, retention pruned its row, then its
        processing task's report arrived; it was refused as "never begun"."""
        assert plan_processed(None, pipeline="p", txid=1, attempt=1, output={}, pruned=True) is (
            ProcessedAction.IGNORE_STALE
        )
        assert not attempt_may_stage(None, pipeline="p", txid=1, attempt=1, pruned=True)

    def test_committed_txid_ignores_reports(self):
        rec = TxRecord(1, 1, TxStatus.COMMITTED)
        assert plan_processed(rec, pipeline="p", txid=1, attempt=1, output=None) is (
            ProcessedAction.IGNORE_STALE
        )
