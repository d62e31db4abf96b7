"""A fill's rows (log/fill_progress.py) on a real Postgres: a fill takes its output over and an
older one finds out at its next step, its progress, the join, retention's floor and a rewind."""

from __future__ import annotations

import pytest

from airflow_txn_provider.log.fill_progress import (
    advance,
    fill_floor,
    filling_outputs,
    join,
    lock_fill,
    rewind_fills,
    take_over,
)
from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.rules.filling import FillProgress
from tests.integration.transactions.test_output_lifecycle import P, a_state, b_state, declare, run


@pytest.fixture
def filling(txlog):
    """``a`` through txids 1-3, then ``b`` declared to fill from history: live from txid 4."""
    assert declare(txlog, [a_state()])
    for txid in (1, 2, 3):
        run(txlog, txid)
    assert declare(txlog, [a_state(), b_state()], start={"b": "history"})
    return txlog


def test_a_fill_takes_its_output_over_and_the_one_before_finds_out_at_its_next_step(filling):
    with filling.engine.begin() as conn:
        assert set(filling_outputs(conn, P)) == {"b"}
        assert take_over(conn, P, "a") is None  # a does not fill
        first = take_over(conn, P, "b")
        assert first == FillProgress("b", 4, 0, 1)
        second = take_over(conn, P, "b")  # another fill process, e.g. a retry of the task
        assert second == FillProgress("b", 4, 0, 2)
        assert lock_fill(conn, P, first) is None  # taken over: it stops
        assert lock_fill(conn, P, second) == second
        ahead = advance(conn, P, second, 2)
        assert ahead == FillProgress("b", 4, 2, 2)
        assert lock_fill(conn, P, second) is None  # not where it left it
        assert lock_fill(conn, P, ahead) == ahead
    with filling.engine.connect() as conn:
        b = read_outputs(conn, P)["b"]
    assert (b.filled_through, b.fill_attempt, b.joined_after_txid) == (2, 2, None)


def test_retention_keeps_what_the_fill_needs_and_a_rewind_takes_its_progress_back(filling):
    with filling.engine.begin() as conn:
        assert fill_floor(conn, P) == 1  # nothing applied yet: every txid from 1
        mine = advance(conn, P, take_over(conn, P, "b"), 3)
        assert fill_floor(conn, P) == 4
        assert rewind_fills(conn, P, 4) == {}  # it had not gone that far
        assert rewind_fills(conn, P, 2) == {"b": 1}  # back to the txid before
        assert lock_fill(conn, P, mine) is None  # the fill finds out and starts from the row
        assert fill_floor(conn, P) == 2
        assert take_over(conn, P, "b") == FillProgress("b", 4, 1, 2)


def test_a_joined_output_fills_no_more(filling):
    with filling.engine.begin() as conn:
        mine = advance(conn, P, take_over(conn, P, "b"), 3)
        join(conn, P, mine, 3)
        assert filling_outputs(conn, P) == {}
        assert fill_floor(conn, P) is None  # retention prunes as it would without it
        assert lock_fill(conn, P, mine) is None
        assert take_over(conn, P, "b") is None
        assert rewind_fills(conn, P, 2) == {}  # a rewind takes it back as any other state
        b = read_outputs(conn, P)["b"]
    assert (b.filled_through, b.joined_after_txid, b.filling) == (3, 3, False)
