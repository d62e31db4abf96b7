"""The window is the coordinator's rule, whatever made txids fail (a cascade, a lease that ran out,
a rewind of more txids than ``max_pending``): a stateful Hypothesis test of the pure rules.

A small in-memory log applies what ``plan_begin``, ``next_to_begin``, ``plan_failure``,
``committable`` and ``plan_rewind`` answer, exactly as the Postgres log writes it; after every
step no more than ``max_pending`` txids hold a live attempt, each inside the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from airflow_txn_provider.rules.coordinator import (
    committable,
    next_to_begin,
    plan_begin,
    plan_failure,
)
from airflow_txn_provider.rules.history import plan_rewind
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import BeginAction, SourceKind, TxStatus
from tests.unit.builders import DONE, FAIL, NOW, PROC, view


@dataclass
class _Tx:
    attempt: int
    status: TxStatus


class WindowMachine(RuleBasedStateMachine):
    """Begin, process, commit, fail and rewind in any order; the window always holds."""

    def __init__(self) -> None:
        super().__init__()
        self.max_pending = 1
        self.last_committed = 0
        self.committed_attempt: dict[int, int] = {}
        self.txs: dict[int, _Tx] = {}

    @initialize(max_pending=st.integers(1, 4))
    def setup(self, max_pending: int) -> None:
        self.max_pending = max_pending

    def view(self) -> PipelineView:
        return PipelineView(
            pipeline="p",
            source_kind=SourceKind.OPAQUE,
            max_pending=self.max_pending,
            last_committed=self.last_committed,
            in_flight=tuple(
                TxRecord(t, tx.attempt, tx.status, failed_by=t if tx.status is FAIL else None)
                for t, tx in sorted(self.txs.items())
            ),
        )

    def _apply_begin(self, txid: int) -> None:
        plan = plan_begin(self.view(), txid)
        for t in plan.invalidate:
            self.txs[t].status = FAIL
        if plan.emits:
            assert plan.attempt is not None
            self.txs[txid] = _Tx(plan.attempt, PROC)

    @rule()
    def begin_next(self) -> None:
        txid = next_to_begin(self.view())
        if txid is not None:
            self._apply_begin(txid)

    @rule(ahead=st.integers(0, 8))
    def begin_any(self, ahead: int) -> None:
        """A begin of any txid, as a DAG run of it would ask (Airflow's runs may run ahead)."""
        self._apply_begin(self.last_committed + 1 + ahead)

    @rule(pick=st.integers(0, 8))
    def processed(self, pick: int) -> None:
        rec = self.txs.get(self.last_committed + 1 + pick)
        if rec is not None and rec.status is PROC:
            rec.status = DONE

    @rule()
    def commit(self) -> None:
        rec = committable(self.view())
        if rec is not None:
            self.last_committed = rec.txid
            self.committed_attempt[rec.txid] = rec.attempt
            del self.txs[rec.txid]

    @rule(n=st.integers(1, 6))
    def run_through(self, n: int) -> None:
        """``n`` txids begun, processed and committed in turn: history for a rewind to undo."""
        for _ in range(n):
            txid = next_to_begin(self.view())
            if txid is not None:
                self._apply_begin(txid)
            for rec in self.txs.values():
                if rec.status is PROC:
                    rec.status = DONE
            self.commit()

    @rule(pick=st.integers(0, 8))
    def fail(self, pick: int) -> None:
        txid = self.last_committed + 1 + pick
        if txid in self.txs:
            for t in plan_failure(self.view(), txid):
                self.txs[t].status = FAIL

    @rule(back=st.integers(0, 12))
    def rewind(self, back: int) -> None:
        to = max(1, self.last_committed + 1 - back)
        plan = plan_rewind(self.view(), to, floor=1)
        for t in plan.rolled_back:
            self.txs[t] = _Tx(self.committed_attempt.pop(t), FAIL)
        for t in plan.failed:
            self.txs[t].status = FAIL
        self.last_committed = plan.last_committed

    @invariant()
    def at_most_max_pending_txids_are_live_and_all_inside_the_window(self) -> None:
        v = self.view()
        live = [r.txid for r in v.in_flight if r.status is not FAIL]
        assert len(live) <= self.max_pending, (live, self.max_pending)
        assert all(t in v.window for t in live), (live, v.window)


TestWindowMachine = WindowMachine.TestCase
TestWindowMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_rewind_of_more_txids_than_the_window_replays_max_pending_at_a_time():
    """The issue's case: ``max_pending=2``, six txids rewound, begin after begin starts two."""
    rewound = view(*((t, 1, FAIL) for t in range(1, 7)), last=0, max_pending=2)
    assert next_to_begin(rewound) == 1
    assert plan_begin(rewound, 1).action is BeginAction.REPLAY
    two_live = view((1, 2, PROC), (2, 2, PROC), *((t, 1, FAIL) for t in range(3, 7)), max_pending=2)
    assert next_to_begin(two_live) is None  # window full: 1 and 2 replay
    assert plan_begin(two_live, 3).action is BeginAction.WAIT_WINDOW
    one_committed = view((2, 2, DONE), *((t, 1, FAIL) for t in range(3, 7)), last=1, max_pending=2)
    assert next_to_begin(one_committed) == 3
    assert plan_begin(one_committed, 4).action is BeginAction.WAIT_PREVIOUS


def test_a_live_txid_beyond_a_narrowed_window_resumes_but_never_reemits():
    """A new declaration narrowed the window under live txids: they finish (resume), and one
    whose lease ran out waits for its expiry to fail it instead of re-emitting outside it."""

    def narrowed(lease_seconds: float) -> PipelineView:
        return PipelineView(
            pipeline="p",
            source_kind=SourceKind.TRANSACTIONAL,
            max_pending=2,
            in_flight=tuple(
                TxRecord(t, 1, PROC, lease_expires_at=NOW + timedelta(seconds=lease_seconds))
                for t in (1, 2, 3)
            ),
            now=NOW,
        )

    assert plan_begin(narrowed(10), 3).action is BeginAction.RESUME
    assert plan_begin(narrowed(-1), 3).action is BeginAction.WAIT_WINDOW
    assert plan_begin(narrowed(-1), 2).action is BeginAction.REEMIT
