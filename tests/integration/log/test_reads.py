"""The log's reads (log/reads.py) on a real Postgres: a view is one snapshot while a commit lands,
and every attempt of a txid is kept in its history."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.integration.log.txids_given import begin_four


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    return begin_four(txlog)


def test_an_unlocked_view_is_one_snapshot_while_a_commit_lands(four, db_url):
    """The page, the gate sensor and the trigger read without the lock: a commit landing between
    the view's two statements (pipeline row, then txid rows) must not look like a corrupt log."""
    txlog, _ = four
    for t in (1, 2):
        txlog.mark_processed("p", t, 1)
    other = TransactionLog.from_url(db_url, migrate=False)
    fired = []

    def commit_between(conn, cursor, statement, *args):
        if not fired and "FROM txn_pipeline" in statement and "FOR UPDATE" not in statement:
            fired.append(statement)
            other.commit("p", 1, 1)  # another process commits txid 1 right now

    event.listen(txlog.engine, "after_cursor_execute", commit_between)
    try:
        view = txlog.view("p")
    finally:
        event.remove(txlog.engine, "after_cursor_execute", commit_between)
        other.engine.dispose()
    assert fired
    assert view.last_committed == 0 and view.record(1).status.value == "processed"
    assert txlog.view("p").last_committed == 1


def test_attempt_history_keeps_every_attempt(four):
    txlog, src = four
    txlog.fail("p", 1, 1, error="first")
    txlog.begin("p", 1, src)
    txlog.mark_processed("p", 1, 2, {"rows": 7})
    txlog.commit("p", 1, 2)
    history = txlog.attempts("p", 1)
    assert [(a.attempt, a.status, a.error) for a in history] == [
        (1, TxStatus.FAILED, "first"),
        (2, TxStatus.COMMITTED, None),
    ]
    assert history[1].output == {"rows": 7} and history[1].ended_at is not None
    assert all(a.metadata == {"start": 0, "end": 10} for a in history)
