"""A state's staged rows measured and quarantined on a real Postgres (``state/audit.py``)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.expectations import (
    Check,
    FailingShare,
    RowCondition,
    RowCount,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import GlobalState, MapState
from airflow_txn_provider.state.audit import Uncheckable, measure, quarantine


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _staged(txlog, pipeline, state, rows, txid=1):
    attempt = txlog.begin(pipeline, txid, Batches()).attempt
    txlog.stage_output(
        pipeline, txid, attempt, lambda c: {state.output_key: state.stage(c, txid, attempt, rows)}
    )
    return attempt


def test_one_query_measures_every_expectation_with_a_few_sorted_failing_keys(txlog):
    txlog.register_pipeline("m", source_kind="transactional", max_pending=2)
    state = MapState("m", "m_pairs", keys={"shop": "text", "day": "integer"}).create(txlog.engine)
    rows = [(f"s{i:02d}", i % 3, -i if i % 2 else i) for i in range(12)]
    attempt = _staged(txlog, "m", state, rows)
    rules = [
        RowCondition(on="m_pairs", condition="delta >= 0", name="no debt"),
        FailingShare(on="m_pairs", condition="day > 0", max_share=0.5, name="days"),
        RowCount(on="m_pairs", min=1, name="some"),
    ]
    with txlog.engine.connect() as conn:
        n, got = measure(conn, state, 1, attempt, rules)
    odd = [r for r in rows if r[2] < 0]
    assert n == 12
    debt, days, some = got
    assert (debt.rows_checked, debt.rows_failed) == (12, len(odd))
    assert debt.sample_keys == tuple(sorted(f"{s}, {d}" for s, d, _ in odd))[:5]
    assert days.rows_failed == sum(1 for r in rows if r[1] == 0)
    assert (some.rows_checked, some.rows_failed, some.sample_keys) == (12, 0, ())


def test_a_null_fails_a_condition_and_a_global_state_shows_its_delta(txlog):
    txlog.register_pipeline("g", source_kind="transactional", max_pending=2)
    total = GlobalState("g", "g_total", value_type="double precision").create(txlog.engine)
    attempt = _staged(txlog, "g", total, [(-2.5,)])
    rule = RowCondition(on="g_total", condition="delta > (SELECT NULL::float)", name="null")
    with txlog.engine.connect() as conn:
        _, (got,) = measure(conn, total, 1, attempt, [rule])
    assert (got.rows_failed, got.sample_keys) == (1, ("-2.5",))


def test_a_condition_postgres_refuses_is_named_and_the_transaction_stays_usable(txlog):
    txlog.register_pipeline("u", source_kind="transactional", max_pending=2)
    state = MapState("u", "u_w", keys={"word": "text"}).create(txlog.engine)
    attempt = _staged(txlog, "u", state, [("a", 1)])
    rules = [
        RowCondition(on="u_w", condition="delta > 0", name="fine"),
        RowCondition(on="u_w", condition="1 / (delta - 1) > 0", name="divides by zero"),
    ]
    with txlog.engine.begin() as conn:
        with pytest.raises(Uncheckable, match="division by zero") as err:
            measure(conn, state, 1, attempt, rules)
        assert err.value.expectation == "divides by zero"
        assert state.staged_count(conn, 1, attempt) == 1  # a savepoint kept the transaction


def test_a_check_is_given_the_rows_in_key_order(txlog):
    txlog.register_pipeline("c", source_kind="transactional", max_pending=2)
    state = MapState("c", "c_w", keys={"word": "text"}).create(txlog.engine)
    attempt = _staged(txlog, "c", state, [("b", 1), ("a", 2)])
    check = Check(on="c_w", fn=lambda rows: (rows[0]["word"] == "a", "first a"), name="first")
    with txlog.engine.connect() as conn:
        _, (got,) = measure(conn, state, 1, attempt, [check])
    assert (got.passed, got.message, got.rows_checked) == (True, "first a", 2)


def test_quarantine_moves_exactly_the_failing_rows_each_with_the_drops_it_fails(txlog):
    txlog.register_pipeline("q", source_kind="transactional", max_pending=2)
    state = MapState("q", "q_w", keys={"word": "text"}).create(txlog.engine)
    rows = [("a", 1), ("bad", -1), ("bad2", 0), ("ok", 5), ("xx", -3)]
    attempt = _staged(txlog, "q", state, rows)
    drops = [
        RowCondition(on="q_w", condition="delta > 0", action="drop", name="pos"),
        RowCondition(on="q_w", condition="word NOT LIKE 'x%'", action="drop", name="no x"),
    ]
    with txlog.engine.begin() as conn:
        assert quarantine(conn, state, 1, attempt, drops) == 3
        assert state.staged(conn, 1, attempt) == [("a", 1), ("ok", 5)]
        moved = conn.exec_driver_sql(
            "SELECT txid, attempt, output, expectations, row FROM txn_quarantine "
            "WHERE pipeline = 'q' ORDER BY row->>'word'"
        ).all()
    assert [tuple(r) for r in moved] == [
        (1, attempt, "q_w", ["pos"], {"word": "bad", "delta": -1}),
        (1, attempt, "q_w", ["pos"], {"word": "bad2", "delta": 0}),
        (1, attempt, "q_w", ["pos", "no x"], {"word": "xx", "delta": -3}),
    ]
