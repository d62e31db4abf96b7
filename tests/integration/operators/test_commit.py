"""The commit task (operators/commit.py) against a real log: it waits for the txid before it,
commits once, fails a stale attempt, and commits the processed txids after it in order."""

from __future__ import annotations

import pytest

from airflow_txn_provider.compat.airflow import AirflowSkipException, TaskDeferred
from airflow_txn_provider.triggers.txn_log import WaitFor
from tests.conftest import set_txn_log_connection
from tests.integration.operators.test_txn import CLAIMER, _context, word_count_dag


@pytest.fixture
def dag(db_url, tmp_path, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    return word_count_dag("ops", tmp_path, seed=1, lines=20)


def test_commit_waits_for_previous_then_is_idempotent(dag):
    begin, commit = dag.get_task(CLAIMER), dag.get_task("commit")
    from airflow_txn_provider.compat.airflow import AirflowFailException

    one = begin.claim(_context(1))
    two = begin.claim(_context(2))
    txlog = begin.txlog()
    # The commit runs once processing ended, failed tasks too: unrecorded output never commits.
    with pytest.raises(AirflowFailException, match="ended without recording output"):
        commit.execute(_context(2, two))
    txlog.mark_processed("ops", 2, two["attempt"], {})
    with pytest.raises(TaskDeferred) as deferred:
        commit.execute(_context(2, two))
    assert deferred.value.trigger.wait_for is WaitFor.COMMIT_GATE
    assert deferred.value.trigger.attempt == two["attempt"]
    assert deferred.value.method_name == "execute_complete"
    with pytest.raises(TaskDeferred):  # a wake-up asks the log again: txid 1 is not committed
        commit.execute_complete(_context(2, two), {"state": "open", "txid": 2})
    txlog.mark_processed("ops", 1, 1, {})
    assert commit.execute(_context(1, one)) == {
        "applied": True,
        "committed_attempt": 1,
        "also_committed": [2],  # processed already: committed right behind it
    }
    assert commit.execute(_context(1, one))["applied"] is False  # a duplicate run: no-op
    committed = {"state": "committed", "txid": 2}  # the commit gate's event
    assert commit.execute_complete(_context(2, two), committed)["applied"] is False  # found done
    with pytest.raises(AirflowSkipException):
        begin.execute(_context(1))  # rerun of a committed txid's run does nothing


def test_a_commit_whose_claim_was_not_published_commits_the_attempt_the_log_holds(dag):
    """A processing task publishes its claim only when its run goes on; one that recorded its
    output and then could not (the api-server away) leaves its commit task no XCom: the commit
    takes the attempt the log holds for its run's txid, and the gate judges it as ever."""
    from airflow_txn_provider.compat.airflow import AirflowFailException

    begin, commit = dag.get_task(CLAIMER), dag.get_task("commit")
    ctx = _context(1)
    one = begin.claim(ctx, publish=False)
    assert ctx["ti"].claim is None  # nothing published
    with pytest.raises(AirflowFailException, match="ended without recording output"):
        commit.execute(_context(1))  # the log's attempt 1 is still processing
    begin.txlog().mark_processed("ops", 1, one["attempt"], {})
    assert commit.execute(_context(1)) == {
        "applied": True,
        "committed_attempt": one["attempt"],
        "also_committed": [],
    }
    with pytest.raises(AirflowFailException, match="recorded no claimed attempt"):
        commit.execute(_context(2))  # txid 2 never began: no claim anywhere


def test_commit_fails_a_stale_attempt(dag):
    from airflow_txn_provider.compat.airflow import AirflowFailException

    begin, commit = dag.get_task(CLAIMER), dag.get_task("commit")
    one = begin.claim(_context(1))
    begin.txlog().fail("ops", 1, 1, error="boom")
    with pytest.raises(AirflowFailException, match="no longer current"):
        commit.execute(_context(1, one))


def test_commit_also_commits_processed_successors_in_order(dag):
    begin, commit = dag.get_task(CLAIMER), dag.get_task("commit")
    txlog = begin.txlog()
    one, two = begin.claim(_context(1)), begin.claim(_context(2))
    txlog.mark_processed("ops", 2, 1, {})  # txid 2 is processed before txid 1
    txlog.mark_processed("ops", 1, 1, {})
    assert commit.execute(_context(1, one))["also_committed"] == [2]
    assert txlog.last_committed("ops") == 2
    committed = {"state": "committed", "txid": 2}  # the commit gate's event
    assert commit.execute_complete(_context(2, two), committed)["applied"] is False  # found done
