"""The pure parts of reading a state as of a txid (issue 61): how far back a read goes (the
rewind's floor, less one), the typed refusal and what it names, and the SQL each read is made of
(one statement; the SQL function's body the same rule)."""

from __future__ import annotations

import pickle

import pytest

from airflow_txn_provider.rules.exceptions import (
    StateTxidNotReadableError,
    TxnError,
    UnknownPipelineError,
)
from airflow_txn_provider.rules.history import rewind_floor
from airflow_txn_provider.state import BucketCountState, GlobalState, MapState
from airflow_txn_provider.state.as_of import (
    _function_body,
    as_of_floor,
    as_of_function,
    as_of_select,
    check_readable,
)


@pytest.mark.parametrize(
    ("pruned", "undo_from", "floor"),
    [(0, 1, 0), (0, 5, 4), (30, 1, 31), (30, 40, 39), (30, 20, 31)],
)
def test_a_read_goes_back_to_the_state_a_rewind_to_its_floor_restores(pruned, undo_from, floor):
    assert as_of_floor(pruned, undo_from) == floor == rewind_floor(pruned, undo_from) - 1


def test_within_reach_passes_and_beyond_is_refused_naming_the_reach():
    bounds = (40, 30, 1)  # last committed, pruned through, undo from
    for txid in (31, 35, 40):
        check_readable("p", "s", txid, bounds, what="x")
    for txid, why in ((30, "retention keeps"), (0, "retention keeps"), (41, "last committed")):
        with pytest.raises(StateTxidNotReadableError, match=why) as refused:
            check_readable("p", "s", txid, bounds, what=f"as of {txid}")
        err = refused.value
        assert isinstance(err, TxnError)
        assert (err.pipeline, err.txid, err.state) == ("p", txid, "s")
        assert (err.floor, err.last_committed) == ("31", "40")
        assert "txids 31 to 40 can be read" in str(err)
        again = pickle.loads(pickle.dumps(err))
        assert (again.floor, again.state, again.txid) == ("31", "s", txid)


def test_what_a_txid_changed_needs_the_state_before_it():
    bounds = (40, 30, 1)
    check_readable("p", "s", 32, bounds, what="x", after=1)
    with pytest.raises(StateTxidNotReadableError) as refused:
        check_readable("p", "s", 31, bounds, what="x", after=1)
    assert refused.value.floor == "32"


def test_an_unknown_pipeline_is_said_so():
    with pytest.raises(UnknownPipelineError):
        check_readable("nope", "s", 1, None, what="x")


def test_every_state_kind_has_the_reads_of_the_past():
    keyed = MapState("p", "words", "opaque", keys={"word": "text", "day": "date"})
    total = GlobalState("p", "total")
    buckets = BucketCountState("p", "buckets", of="words")
    for state in (keyed, total, buckets):
        assert callable(state.as_of) and callable(state.history) and callable(state.changes)
    assert callable(total.value_as_of) and not hasattr(keyed, "value_as_of")
    assert as_of_function("words") == "txn_as_of_words"


def test_the_sql_reads_the_first_later_undo_record_of_a_key_and_the_function_checks_first():
    state = MapState("p.x-1", "words", "non_transactional", keys={"word": "text", "day": "date"})
    sql = as_of_select(state.backing, "$1")
    assert 'DISTINCT ON (k."word", k."day")' in sql and 'ORDER BY k."word", k."day", u.txid' in sql
    assert "u.txid > $1" in sql and "NOT EXISTS" in sql and "UNION ALL" in sql
    filtered = as_of_select(state.backing, ":n", keys=True)
    assert filtered.count("CAST(:key0 AS text[]), CAST(:key1 AS date[])") == 2
    state = MapState("p.x-1", "words", "transactional", keys={"word": "text", "day": "date"})
    body = _function_body(state.backing, "p.x-1")
    assert body.index("RAISE EXCEPTION 'state words") < body.index("RETURN QUERY")
    assert "p.name = 'p.x-1'" in body and "ERRCODE = '22023'" in body


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_a_state_keeping_its_txids_reads_the_past_in_two_scans_without_a_sort(kind):
    """A row's txid is the last commit that touched it; a record's ``old_txid`` the one before:
    a key untouched after N is its row (txid <= N), a touched one is in the one record after N
    whose row before was last touched <= N. A key's history walks those txids back."""
    state = MapState("p", "words", kind, keys={"word": "text", "day": "date"})
    sql = as_of_select(state.backing, "$1")
    assert "DISTINCT ON" not in sql and "NOT EXISTS" not in sql and "ORDER BY" not in sql
    assert "WHERE s.txid <= $1" in sql and "u.old_txid" in sql
    assert 'u.txid > $1 AND k."txn:existed" AND k."txn:was" <= $1' in sql
    filtered = as_of_select(state.backing, ":n", keys=True)
    assert filtered.count("CAST(:key0 AS text[]), CAST(:key1 AS date[])") == 2
