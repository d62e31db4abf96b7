"""Which notified changes end a wait in a worker (rules.waiting.may_end_*_wait): a change the
rule lets pass must not change what the waiter would decide on reading the log again."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_txn_provider.rules.coordinator import committable
from airflow_txn_provider.rules.records import PipelineView
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.rules.waiting import (
    TxidChange,
    awaits_its_turn,
    may_begin_now,
    may_end_ahead_wait,
    may_end_previous_wait,
    may_end_turn_wait,
    previous_unbegun,
    runs_ahead,
)
from tests.unit.builders import DONE, FAIL, PROC, view

COMMITTED = TxStatus.COMMITTED


@st.composite
def views(draw: st.DrawFn) -> PipelineView:
    """A pipeline as the log holds one: txids after the last committed, each processing or
    processed, from the oldest failed one on (a failure cascades) all failed."""
    last = draw(st.integers(0, 5))
    max_pending = draw(st.integers(1, 4))
    count = draw(st.integers(0, max_pending))
    statuses = [draw(st.sampled_from([PROC, DONE])) for _ in range(count)]
    failed_from = draw(st.integers(0, count))
    records = [
        (last + 1 + i, 1, FAIL if i >= failed_from and failed_from < count else s)
        for i, s in enumerate(statuses)
    ]
    return view(*records, last=last, max_pending=max_pending)


def _with(v: PipelineView, change: TxidChange) -> PipelineView:
    """``v`` after the write ``change`` notifies (a commit is of the oldest txid, in order)."""
    records = {r.txid: (r.txid, r.attempt, r.status) for r in v.in_flight}
    last = v.last_committed
    if change.status is COMMITTED:
        records.pop(change.txid)
        last = change.txid
    else:
        attempt = records[change.txid][1] if change.txid in records else 1
        records[change.txid] = (change.txid, attempt, change.status)
    return view(*sorted(records.values()), last=last, max_pending=v.max_pending)


def _changes(v: PipelineView) -> list[TxidChange]:
    """Every write the log may make next: a begin (new, in the window; or the replay of the
    oldest failed txid), a processed, the commit of the oldest txid, a failure."""
    out = []
    failed = [r for r in v.in_flight if r.status is FAIL]
    if failed:
        out.append(TxidChange(failed[0].txid, PROC))
    elif v.next_new_txid in v.window:
        out.append(TxidChange(v.next_new_txid, PROC))
    for r in v.in_flight:
        if r.status is PROC:
            out += [TxidChange(r.txid, DONE), TxidChange(r.txid, FAIL)]
        if r.status is DONE:
            out.append(TxidChange(r.txid, FAIL))
    if v.in_flight and v.in_flight[0].status is DONE:
        out.append(TxidChange(v.in_flight[0].txid, COMMITTED))
    return out


WAITERS = range(1, 14)


def _slept_through(
    v: PipelineView, ends_wait: Callable[[TxidChange], bool]
) -> list[tuple[TxidChange, PipelineView]]:
    """The next writes a waiter's rule lets pass, each with the view after it."""
    return [(change, _with(v, change)) for change in _changes(v) if not ends_wait(change)]


@settings(max_examples=400, deadline=None)
@given(views())
def test_a_run_ahead_sleeps_only_through_changes_that_keep_it_waiting(v: PipelineView) -> None:
    for txid in WAITERS:
        if txid not in runs_ahead(v) or may_begin_now(v, txid):
            continue  # not waiting
        ends = partial(may_end_ahead_wait, txid=txid, max_pending=v.max_pending)
        for change, after in _slept_through(v, ends):
            assert txid in runs_ahead(after), (v, change, txid)
            assert not may_begin_now(after, txid), (v, change, txid)


@settings(max_examples=400, deadline=None)
@given(views())
def test_a_claim_sleeps_only_through_changes_that_leave_the_txid_before_unbegun(
    v: PipelineView,
) -> None:
    for txid in WAITERS:
        if txid in runs_ahead(v) or not previous_unbegun(v, txid):
            continue
        for change, after in _slept_through(v, partial(may_end_previous_wait, txid=txid)):
            assert txid not in runs_ahead(after), (v, change, txid)
            assert previous_unbegun(after, txid), (v, change, txid)


@settings(max_examples=400, deadline=None)
@given(views())
def test_a_processed_txid_sleeps_only_through_changes_that_leave_its_turn_unchanged(
    v: PipelineView,
) -> None:
    for txid in WAITERS:
        if not awaits_its_turn(v, txid) or committable(v) is not None:
            continue
        for change, after in _slept_through(v, partial(may_end_turn_wait, txid=txid)):
            assert after.last_committed < txid, (v, change, txid)
            assert awaits_its_turn(after, txid), (v, change, txid)
            assert committable(after) is None, (v, change, txid)


def test_what_ends_each_wait() -> None:
    # txid 7 ahead of a window of 2: the commit of 5 opens [6, 8), the begin of 6 is its turn
    assert may_end_ahead_wait(TxidChange(5, COMMITTED), 7, 2)
    assert not may_end_ahead_wait(TxidChange(4, COMMITTED), 7, 2)
    assert may_end_ahead_wait(TxidChange(6, PROC), 7, 2)
    assert not may_end_ahead_wait(TxidChange(5, PROC), 7, 2)
    assert not may_end_ahead_wait(TxidChange(6, DONE), 7, 2)
    assert may_end_ahead_wait(TxidChange(3, FAIL), 7, 2)
    # anything but another txid's processed output
    assert may_end_previous_wait(TxidChange(6, PROC), 7)
    assert may_end_previous_wait(TxidChange(6, DONE), 7)
    assert not may_end_previous_wait(TxidChange(5, DONE), 7)
    assert may_end_previous_wait(TxidChange(2, FAIL), 7)
    # a txid up to it processed, committed or failed; no begin
    assert may_end_turn_wait(TxidChange(6, DONE), 7)
    assert may_end_turn_wait(TxidChange(7, COMMITTED), 7)
    assert not may_end_turn_wait(TxidChange(8, DONE), 7)
    assert not may_end_turn_wait(TxidChange(6, PROC), 7)
