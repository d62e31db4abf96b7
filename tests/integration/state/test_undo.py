"""A state's undo records (state/undo.py) on a real Postgres: one record a commit, a rewind to txid
N putting back every key as it was after N - 1, and retention pruning the records."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_txn_provider.state import MapState
from airflow_txn_provider.state.undo import UndoRecords

BATCHES = {
    1: [("a", 1), ("b", 1)],
    2: [("b", 1), ("c", 1)],  # b changed, c new
    3: [("a", 1), ("d", 1)],  # a changed, d new
}


def commit_batches(conn, words, keep_after: int):
    """Stage and apply each of ``BATCHES`` in txid order; the state's rows after ``keep_after``."""
    kept = None
    for txid, batch in BATCHES.items():
        words.stage(conn, txid, 1, batch)
        words.apply(conn, txid, 1)
        if txid == keep_after:
            kept = words.rows(conn)  # bookkeeping columns and all
    return kept


def records(conn, undo):
    return list(conn.execute(text(f"SELECT txid FROM {undo.table.qundo} ORDER BY txid")).scalars())


@pytest.mark.parametrize("kind", ["transactional", "opaque", "non_transactional"])
def test_a_rewind_puts_back_every_key_the_undone_commits_changed(engine, kind):
    words = MapState("p", f"undo_{kind}", kind, keys={"word": "text"}).create(engine)
    undo = UndoRecords(words.backing)
    with engine.begin() as conn:
        after_1 = commit_batches(conn, words, keep_after=1)
        words.stage(conn, 4, 1, [("e", 1)])  # staged, never applied
        assert records(conn, undo) == [1, 2, 3]  # one record a commit, not one a key
        assert len(words.rows(conn)) == 4
    with engine.begin() as conn:
        assert undo.rewind(conn, 2) == (2, 2)  # a and b restored, c and d removed
        assert words.rows(conn) == after_1
        assert records(conn, undo) == [1]  # the undone commits' records went with them
        assert words.staged_count(conn, 4, 1) == 0  # and the later txids' staged rows


def test_retention_prunes_the_records_and_a_rewind_above_them_still_restores(engine):
    words = MapState("p", "pruned", "transactional", keys={"word": "text"}).create(engine)
    undo = UndoRecords(words.backing)
    with engine.begin() as conn:
        after_2 = commit_batches(conn, words, keep_after=2)
        undo.prune(conn, 2)
        assert records(conn, undo) == [3]
        assert undo.rewind(conn, 3) == (1, 1)  # a restored, d removed
        assert words.rows(conn) == after_2
        assert records(conn, undo) == []
