"""What the Transactions page shows of a state's past (issue 61), with plain values: a typed key
parsed by its columns' types, the rows of a key's history and of what a txid changed, and the
txid page's sentence when the changes cannot be read (not committed, beyond retention), and that
a committed attempt's changes are read once."""

from __future__ import annotations

import pickle
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from types import SimpleNamespace

import pytest
from sqlalchemy.engine import make_url

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.exceptions import StateTxidNotReadableError
from airflow_txn_provider.state import GlobalState, MapState
from airflow_txn_provider.state.as_of import KeyChange, TxidChange
from airflow_txn_provider.ui import state_reads
from airflow_txn_provider.ui.errors import StateKeyError, UnknownStateError

KEYED = MapState("p", "sales", keys={"region": "text", "n": "integer", "day": "date"})
TOTAL = GlobalState("p", "total")
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


# -- a typed key -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqltype", "typed", "value"),
    [
        ("text", " eu ", " eu "),  # a text key as typed, spaces included
        ("text", "<b>", "<b>"),
        ("bigint", " 42 ", 42),
        ("bigint", "-9223372036854775808", -(2**63)),
        ("integer", "2147483647", 2**31 - 1),
        ("smallint", "-7", -7),
        ("boolean", "TRUE", True),
        ("boolean", "f", False),
        ("boolean", "0", False),
        ("date", "2026-03-01", date(2026, 3, 1)),
        ("timestamptz", "2026-03-01T12:00:00Z", T0),
        ("timestamptz", "2026-03-01T12:00:00", T0),  # naive: UTC
        ("timestamptz", "2026-03-01T14:00:00+02:00", T0),
        ("numeric", "1.50", Decimal("1.50")),
        ("double precision", "2.5", 2.5),
    ],
)
def test_a_typed_key_value_becomes_its_columns_type(sqltype, typed, value):
    got = state_reads.parse_key_value("c", sqltype, typed)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("sqltype", "typed"),
    [
        ("bigint", "4.5"),
        ("bigint", "abc"),
        ("bigint", "9223372036854775808"),  # one past bigint
        ("integer", "2147483648"),
        ("smallint", "40000"),
        ("boolean", "maybe"),
        ("date", "2026-13-01"),
        ("timestamptz", "yesterday"),
        ("numeric", "1,5"),
        ("double precision", "x"),
    ],
)
def test_a_value_that_is_not_of_the_columns_type_says_what_the_column_takes(sqltype, typed):
    with pytest.raises(
        ValueError, match=f"key column 'c' is of type {sqltype}: {typed!r} is not one"
    ):
        state_reads.parse_key_value("c", sqltype, typed)


def test_a_key_is_one_value_per_key_column_in_order():
    assert state_reads.parse_key(KEYED, ["eu", "3", "2026-03-01"]) == ("eu", 3, date(2026, 3, 1))
    with pytest.raises(StateKeyError, match="keyed by region, n, day: give one value per") as e:
        state_reads.parse_key(KEYED, ["eu", "3"])
    assert (e.value.pipeline, e.value.state) == ("p", "sales")
    with pytest.raises(StateKeyError, match="'n' is of type integer: 'x' is not one"):
        state_reads.parse_key(KEYED, ["eu", "x", "2026-03-01"])
    with pytest.raises(StateKeyError, match="give one value per column"):
        state_reads.parse_key(KEYED, [])


def test_a_global_states_key_is_its_one_key_and_takes_no_value():
    assert state_reads.parse_key(TOTAL, []) == (True,)
    with pytest.raises(StateKeyError, match="is global: it has one value and no key"):
        state_reads.parse_key(TOTAL, ["x"])


# -- rows --------------------------------------------------------------------------------------


def test_a_change_is_after_minus_before_an_absent_key_counting_zero():
    assert state_reads.change_of(None, 5) == 5
    assert state_reads.change_of(7, None) == -7
    assert state_reads.change_of(3, 3) == 0
    assert state_reads.change_of(None, None) is None
    assert state_reads.change_of(Decimal("1.5"), Decimal("4")) == 2.5
    assert state_reads.change_of(Decimal("1"), Decimal("4")) == 3
    assert [state_reads.signed(v) for v in (5, -2, 0, 1.5, None)] == ["+5", "-2", "0", "+1.5", "—"]


def test_a_row_of_what_a_txid_changed():
    row = state_reads.change_row(TxidChange(("eu", 3, date(2026, 3, 1)), None, Decimal("12")))
    assert row == {
        "key": "eu, 3, 2026-03-01",
        "key_values": ["eu", 3, "2026-03-01"],
        "before": None,
        "after": 12,
        "change": 12,
    }
    whole = state_reads.change_row(TxidChange((True,), 10, 4), is_global=True)
    assert whole == {"key": "(value)", "key_values": [], "before": 10, "after": 4, "change": -6}


def test_a_row_of_a_keys_history():
    row = state_reads.history_row(KeyChange(42, 2, T0, Decimal("3"), None))
    assert row == {
        "txid": 42,
        "run_id": "txid-000042",
        "attempt": 2,
        "committed_at": "2026-03-01T12:00:00+00:00",
        "before": 3,
        "after": None,
        "change": -3,
    }
    # a timestamp in another zone, as Postgres hands it, is shown in UTC
    other = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert state_reads.history_row(KeyChange(1, None, other, None, 1))["committed_at"] == (
        "2026-03-01T12:00:00+00:00"
    )


def test_a_states_changes_are_bounded_and_say_when_more_keys_changed():
    changes = [TxidChange((f"k{i}", i, date(2026, 1, 1)), 0, 10 - i) for i in range(4)]
    got = state_reads.state_changes(KEYED, changes, 3)
    assert (got["name"], got["type"], got["kind"]) == ("sales", "map", "transactional")
    assert got["key_columns"] == ["region", "n", "day"]
    assert [c["key"] for c in got["changes"]] == [
        "k0, 0, 2026-01-01",
        "k1, 1, 2026-01-01",
        "k2, 2, 2026-01-01",
    ]
    assert got["more"] is True
    assert state_reads.state_changes(KEYED, changes, 4)["more"] is False
    whole = state_reads.state_changes(TOTAL, [TxidChange((True,), None, 5)], 3)
    assert (whole["type"], whole["key_columns"], whole["changes"][0]["key"]) == (
        "global",
        [],
        "(value)",
    )
    assert state_reads.bounded([1, 2, 3], 3) == ([1, 2, 3], False)
    assert state_reads.bounded([1, 2, 3], 2) == ([1, 2], True)


def test_which_txids_a_history_covers():
    assert state_reads.reach_text(0, 8) == "txids 1 … 8 are kept"
    assert state_reads.reach_text(4, 8) == "txids 5 … 8 are kept"
    assert state_reads.reach_text(0, 0) == "no committed txid is kept"


# -- what a txid changed, for its page ---------------------------------------------------------


@pytest.fixture
def log_engine():
    """Stands for the log's engine: only its URL is read before a read."""
    return SimpleNamespace(url=make_url("postgresql+psycopg://u:secret@db/log"))


def test_a_txid_not_committed_changed_nothing_and_nothing_is_read(log_engine, monkeypatch):
    monkeypatch.setattr(state_reads, "read_txid_changes", lambda *a: pytest.fail("read"))
    got = state_reads.txid_changes_payload(log_engine, "p", 9, 7, None)
    assert got == {
        "status": "not_committed",
        "message": "txid 9 has not committed (the last committed txid is 7): it changed no "
        "state yet",
        "limit": state_reads.CHANGES_LIMIT,
        "states": [],
    }


def test_a_txid_beyond_retention_is_said_in_a_sentence_from_the_typed_error(
    log_engine, monkeypatch
):
    detail = "state 'sales': cannot read what txid 3 changed: txids 5 to 8 can be read (…)"

    def refuse(*args):
        raise StateTxidNotReadableError(detail, pipeline="p", txid=3, state="sales", floor="5")

    monkeypatch.setattr(state_reads, "read_txid_changes", refuse)
    got = state_reads.txid_changes_payload(log_engine, "p", 3, 8, (1, T0))
    assert got == {"status": "refused", "message": detail, "limit": 20, "states": []}


def test_a_committed_attempts_changes_are_read_once(log_engine, monkeypatch):
    reads: list[tuple] = []

    def read(engine, pipeline, txid, limit):
        reads.append((pipeline, txid, limit))
        return [{"name": "sales", "type": "map", "changes": [], "more": False}]

    monkeypatch.setattr(state_reads, "read_txid_changes", read)
    monkeypatch.setattr(state_reads, "_CHANGES_CACHE", {})
    first = state_reads.txid_changes_payload(log_engine, "p", 3, 8, (1, T0))
    assert first["status"] == "ok" and first["states"][0]["name"] == "sales"
    assert (
        state_reads.txid_changes_payload(log_engine, "p", 3, 9, (1, T0)) == first
    )  # a later commit
    assert len(reads) == 1
    state_reads.txid_changes_payload(log_engine, "p", 3, 9, (2, T0))  # a rewind: another attempt
    state_reads.txid_changes_payload(log_engine, "p", 3, 9, None)  # its record pruned: no cache
    state_reads.txid_changes_payload(log_engine, "p", 3, 9, None)
    assert len(reads) == 4
    assert "secret" not in repr(state_reads._CHANGES_CACHE)  # the key has no password


def test_a_state_that_cannot_be_read_is_read_again(log_engine, monkeypatch):
    reads = []

    def read(engine, pipeline, txid, limit):
        reads.append(txid)
        return [{"name": "gone", "type": "error", "error": "no table"}]

    monkeypatch.setattr(state_reads, "read_txid_changes", read)
    monkeypatch.setattr(state_reads, "_CHANGES_CACHE", {})
    for _ in range(2):
        state_reads.txid_changes_payload(log_engine, "p", 3, 8, (1, T0))
    assert reads == [3, 3]


@pytest.mark.parametrize("cls", [StateKeyError, UnknownStateError])
def test_a_state_reads_error_names_its_state_and_keeps_it_across_pickling(cls):
    err = cls("no such key", pipeline="p", state="sales")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls
    assert (again.pipeline, again.state, again.detail) == ("p", "sales", "no such key")
