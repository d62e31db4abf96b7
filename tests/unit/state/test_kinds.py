"""Each state kind's rule (state/kinds.py): the SQL parts the apply statement is built from."""

import pytest

from airflow_txn_provider.rules.vocabulary import StateKind
from airflow_txn_provider.state.kinds import (
    RULES,
    NonTransactionalRule,
    OpaqueRule,
    TransactionalRule,
    rule_for,
)


def plus(a: str, b: str) -> str:
    return f"{a} + {b}"


def test_every_kind_has_exactly_one_rule():
    assert set(RULES) == set(StateKind)
    assert {type(r) for r in RULES.values()} == {
        NonTransactionalRule,
        TransactionalRule,
        OpaqueRule,
    }
    for kind in StateKind:
        assert rule_for(kind.value) is RULES[kind]
    with pytest.raises(ValueError):
        rule_for("exactly_once")


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        (StateKind.NON_TRANSACTIONAL, []),
        (StateKind.TRANSACTIONAL, ["txid bigint NOT NULL"]),
        (StateKind.OPAQUE, ["prev_value numeric", "txid bigint NOT NULL"]),
    ],
)
def test_bookkeeping_columns(kind, columns):
    assert rule_for(kind).columns("numeric") == columns


def test_non_transactional_adds_every_batch_unguarded():
    upsert = NonTransactionalRule().upsert(plus, "sum")
    assert upsert.update == "value = s.value + EXCLUDED.value"
    assert upsert.guard == ""


def test_kinds_storing_a_txid_skip_rows_of_later_txids():
    for rule in (TransactionalRule(), OpaqueRule()):
        upsert = rule.upsert(plus, "sum")
        assert upsert.guard == "WHERE s.txid <= EXCLUDED.txid"
        assert upsert.columns.endswith("txid") and upsert.values.endswith("CAST(:txid AS bigint)")


def test_transactional_keeps_the_value_of_an_applied_txid():
    update = TransactionalRule().upsert(plus, "sum").update
    assert "WHEN s.txid = EXCLUDED.txid THEN s.value " in update


def test_opaque_reapplies_a_replay_over_the_previous_value():
    update = OpaqueRule().upsert(plus, "sum").update
    assert "WHEN s.txid = EXCLUDED.txid THEN COALESCE(s.prev_value, 0) + EXCLUDED.value" in update
    assert "prev_value = CASE WHEN s.txid = EXCLUDED.txid THEN s.prev_value ELSE s.value END" in (
        update
    )
    # max/min: GREATEST/LEAST skip a NULL previous value by themselves
    update = OpaqueRule().upsert(lambda a, b: f"GREATEST({a}, {b})", "max").update
    assert "THEN GREATEST(s.prev_value, EXCLUDED.value)" in update
