"""What the Airflow side waits for: commit gate, may-begin, outcome, poison policy, and the trigger
that watches for them (evaluation with plain views, serialisation round trip, a real poll)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from airflow_txn_provider.rules.config import RUN_LEAD, RUNS_AHEAD
from airflow_txn_provider.rules.records import PipelineView
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.rules.waiting import (
    GateState,
    begin_spacing,
    commit_gate,
    may_begin_now,
    runs_ahead,
    runs_ahead_wanted,
    runs_to_make,
    should_retry,
    txid_outcome,
)
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor, evaluate
from tests.unit.builders import DONE, FAIL, PROC, view


def payload(*args, **kwargs):
    """:func:`evaluate`'s event as its payload (before the trigger adds the txid), or ``None``."""
    event = evaluate(*args, **kwargs)
    return None if event is None else event.to_payload()


@pytest.mark.parametrize(
    ("records", "last", "txid", "attempt", "expected"),
    [
        ([(3, 1, DONE)], 2, 3, 1, GateState.OPEN),
        ([(3, 1, PROC), (4, 1, DONE)], 2, 4, 1, GateState.WAIT),
        ([(3, 1, DONE)], 2, 3, 2, GateState.STALE),  # another attempt is current
        ([(3, 2, FAIL)], 2, 3, 2, GateState.STALE),  # this attempt was failed
        ([], 3, 3, 1, GateState.COMMITTED),
        ([(3, 1, DONE)], 2, 4, 1, GateState.STALE),  # never begun
        # its processing tasks ended without recording output: no waiting for a commit
        ([(3, 1, PROC)], 2, 3, 1, GateState.UNFINISHED),
        ([(3, 1, DONE), (4, 1, PROC)], 2, 4, 1, GateState.UNFINISHED),
    ],
)
def test_commit_gate(records, last, txid, attempt, expected):
    assert commit_gate(view(*records, last=last), txid, attempt) is expected


def test_may_begin_now_follows_plan_begin():
    assert may_begin_now(view(), 1)
    assert not may_begin_now(view(), 2)  # txid 1 first
    assert not may_begin_now(view((1, 1, FAIL)), 2)  # 1 must re-initialise first
    assert may_begin_now(view((1, 1, FAIL)), 1)
    full = view((1, 1, PROC), (2, 1, PROC), max_pending=2)
    assert not may_begin_now(full, 3)  # window full
    assert may_begin_now(full, 2)  # re-emission of a live txid is not a wait


def test_txid_outcome():
    assert txid_outcome(view(last=4), 3) is TxStatus.COMMITTED
    assert txid_outcome(view((5, 2, FAIL), last=4), 5) is TxStatus.FAILED
    assert txid_outcome(view((5, 2, DONE), last=4), 5) is None
    assert txid_outcome(view(last=4), 9) is None


def test_poison_policy():
    assert should_retry(1, 3) and should_retry(2, 3)
    assert not should_retry(3, 3)


def test_evaluate_each_condition():
    assert payload(WaitFor.CAN_BEGIN, view((1, 1, PROC)), 2, 0) == {"state": "can_begin"}
    assert payload(WaitFor.CAN_BEGIN, view((1, 1, FAIL)), 2, 0) is None
    assert payload(WaitFor.COMMIT_GATE, view((1, 1, PROC), (2, 1, DONE)), 2, 1) is None
    assert payload(WaitFor.COMMIT_GATE, view((2, 1, DONE), last=1), 2, 1) == {"state": "open"}
    assert payload(WaitFor.COMMIT_GATE, view((2, 2, DONE), last=1), 2, 1) == {"state": "stale"}
    # OUTCOME: a failure already handled (attempt 2) does not fire again; a newer one does
    assert payload(WaitFor.OUTCOME, view((2, 2, FAIL), last=1), 2, 2) is None
    assert payload(WaitFor.OUTCOME, view((2, 3, FAIL), last=1), 2, 2) == {
        "state": "failed",
        "attempt": 3,
    }
    assert payload(WaitFor.OUTCOME, view(last=2), 2, 2) == {"state": "committed"}


def test_trigger_serialize_round_trip():
    trigger = TxnLogTrigger(
        txn_log_conn_id="c",
        pipeline="p",
        txid=7,
        attempt=2,
        wait_for="commit_gate",
        poll_interval=0.5,
    )
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert kwargs["wait_for"] == "commit_gate" and kwargs["txid"] == 7


def test_evaluate_wakes_the_failure_sensor_when_the_lease_runs_out():
    from tests.unit.builders import NOW, leased

    alive = leased(((1, 1, DONE, None), (2, 3, PROC, 5)))
    gone = leased(((1, 1, DONE, None), (2, 3, PROC, -1)))
    assert payload(WaitFor.OUTCOME, alive, 2, 2) is None
    assert payload(WaitFor.OUTCOME, gone, 2, 2) == {"state": "lease_expired", "attempt": 3}
    assert payload(WaitFor.OUTCOME, gone, 1, 0) is None  # processed: no lease to lose
    assert NOW == gone.now


def test_evaluate_wakes_a_watch_whose_requeue_never_came():
    failed = view((1, 2, PROC), (2, 1, FAIL))
    blocked = view((1, 2, FAIL), (2, 1, FAIL))
    for stuck_for, timeout, expected in [
        (59, 60, None),
        (60, 60, "not_requeued"),
        (1e9, None, None),
    ]:
        got = payload(WaitFor.OUTCOME, failed, 2, 1, stuck_for=stuck_for, requeue_timeout=timeout)
        assert (got or {}).get("state") == expected
    # held back by txid 1 (failed, not yet replayed): waiting is right, whatever the time
    assert payload(WaitFor.OUTCOME, blocked, 2, 1, stuck_for=1e9, requeue_timeout=60) is None


def test_awaits_requeue():
    from airflow_txn_provider.rules.waiting import awaits_requeue

    v = view((1, 2, PROC), (2, 1, FAIL), (3, 1, FAIL))
    assert awaits_requeue(v, 2, 1)
    assert not awaits_requeue(v, 3, 1)  # 2 must replay first
    assert not awaits_requeue(v, 2, 0)  # a newer failure: handled as a failure, not a stall
    assert not awaits_requeue(v, 1, 2)  # alive


def test_trigger_refuses_a_non_positive_poll_interval():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="poll_interval must be > 0"):
            TxnLogTrigger(
                txn_log_conn_id="c", pipeline="p", txid=1, wait_for="outcome", poll_interval=bad
            )


@pytest.mark.parametrize(
    ("records", "txid", "waits"),
    [
        (((1, 1, PROC), (2, 1, DONE)), 2, True),  # txid 1 still processing
        (((1, 1, DONE), (2, 1, DONE)), 2, True),  # processed: its task commits both
        (((1, 2, FAIL), (2, 1, DONE)), 2, False),  # a failure before it: its sensor answers
        (((1, 1, PROC), (2, 1, PROC)), 2, False),  # not processed itself
        (((1, 1, PROC),), 2, False),  # not in flight
    ],
)
def test_a_processed_txid_awaits_its_turn_only_behind_live_txids(records, txid, waits):
    from airflow_txn_provider.rules.waiting import awaits_its_turn

    assert awaits_its_turn(view(*records), txid) is waits


# -- how many runs a claim makes ahead: the txids that begin within a run's lead ----------------


def _paced(spacing: float | None, *, max_pending: int = 2) -> PipelineView:
    """A full window of ``max_pending`` txids after txid 3, begun ``spacing`` seconds apart
    (``None``: no begin time known)."""
    from datetime import timedelta

    from airflow_txn_provider.rules.records import TxRecord
    from tests.unit.builders import NOW

    base = view(*[(4 + i, 1, PROC) for i in range(max_pending)], last=3, max_pending=max_pending)
    records = tuple(
        TxRecord(
            r.txid,
            r.attempt,
            r.status,
            metadata=r.metadata,
            begun_at=None if spacing is None else NOW + timedelta(seconds=spacing * i),
        )
        for i, r in enumerate(base.in_flight)
    )
    return dataclasses.replace(base, in_flight=records)


@pytest.mark.parametrize(
    ("spacing", "wanted"),
    [(None, RUNS_AHEAD), (0.0, RUNS_AHEAD), (0.5, 3), (0.8, 2), (1.4, 2), (1.5, 1), (9.0, 1)],
)
def test_a_claim_makes_as_many_runs_ahead_as_txids_begin_within_a_runs_lead(spacing, wanted):
    assert RUN_LEAD == 1.5  # the figures below
    v = _paced(spacing)
    assert runs_ahead_wanted(v) == wanted
    assert runs_to_make(v) == range(6, 6 + wanted)  # the window [4, 6) is full
    assert runs_ahead(v) == range(6, 6 + RUNS_AHEAD)  # the runs that may wait, made earlier too


def test_the_pace_is_the_mean_spacing_of_the_begins_in_flight():
    assert begin_spacing(_paced(None)) is None
    assert begin_spacing(_paced(0.6, max_pending=4)) == pytest.approx(0.6)


def test_a_txid_a_fail_expectation_failed_stops_at_once_whatever_its_budget():
    """A replay would stage the same rows: the first such failure is a poison batch; a person's
    rerun after the stop that fails only on its own counts from 0 again."""
    from airflow_txn_provider.rules.records import TxRecord
    from airflow_txn_provider.rules.vocabulary import FailureResponse
    from airflow_txn_provider.rules.waiting import respond_to_failure

    audit = TxRecord(
        txid=4, attempt=1, status=TxStatus.FAILED, failed_by=4, failed_expectation=True
    )
    assert respond_to_failure((audit,), max_attempts=99) is FailureResponse.STOP
    stopped = dataclasses.replace(audit, response=FailureResponse.STOP)
    own = TxRecord(txid=4, attempt=2, status=TxStatus.FAILED, failed_by=4)
    assert respond_to_failure((stopped, own), max_attempts=2) is FailureResponse.REQUEUE
    cascade = dataclasses.replace(audit, failed_by=3)  # failed with txid 3: 3 answers
    assert respond_to_failure((cascade,), max_attempts=99) is FailureResponse.LEAVE_TO_ORIGIN
