"""Concurrency on a real Postgres, with real OS processes racing each other.

Airflow can run the same task instance twice (apache/airflow#23520) and a cleared run can overlap
its predecessor: the log's row locks, not Airflow, must keep every commit single and fenced.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback

import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.exceptions import StaleAttemptError
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ctx = mp.get_context("fork")


class Fixed(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


def _child(index, fn, url, barrier, queue, *args):
    txlog = TransactionLog(create_engine(url), migrate=False)
    try:
        barrier.wait(timeout=30)
        queue.put((index, ("ok", fn(txlog, *args))))
    except Exception as err:
        queue.put((index, ("error", type(err).__name__, str(err), traceback.format_exc())))
    finally:
        txlog.engine.dispose()


def race(url, *calls):
    """Run each (fn, *args) in its own process, released at the same instant; return the results
    in call order."""
    barrier = ctx.Barrier(len(calls))
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(i, fn, url, barrier, queue, *args))
        for i, (fn, *args) in enumerate(calls)
    ]
    for p in procs:
        p.start()
    results = [r for _, r in sorted(queue.get(timeout=60) for _ in procs)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def _slow_commit(txlog, txid, attempt):
    def apply(conn, record):
        conn.execute(text("INSERT INTO sink VALUES (:t, :a)"), {"t": txid, "a": attempt})
        time.sleep(0.3)  # hold the commit open so the other process surely overlaps it

    return txlog.commit("p", txid, attempt, apply).applied


def _fail(txlog, txid):
    return txlog.fail("p", txid, 1, error="lost")


@pytest.fixture
def pipeline(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    with txlog.engine.begin() as conn:
        conn.execute(text("CREATE TABLE sink (txid bigint, attempt int)"))
    return txlog


def sink(txlog):
    with txlog.engine.connect() as conn:
        return conn.execute(text("SELECT txid, attempt FROM sink ORDER BY txid")).all()


def test_two_processes_commit_the_same_txid(pipeline, db_url):
    pipeline.begin("p", 1, Fixed())
    pipeline.mark_processed("p", 1, 1)
    results = race(db_url, (_slow_commit, 1, 1), (_slow_commit, 1, 1))
    assert sorted(results) == [("ok", False), ("ok", True)]  # one applies, the other is a no-op
    assert sink(pipeline) == [(1, 1)]


def test_stale_attempt_races_a_failure(pipeline, db_url):
    """A worker commits attempt 1 while the attempt is failed: exactly one of them wins."""
    outcomes = set()
    for txid in range(1, 7):
        pipeline.begin("p", txid, Fixed())
        pipeline.mark_processed("p", txid, 1)
        commit, fail = race(db_url, (_slow_commit, txid, 1), (_fail, txid))
        if commit == ("ok", True):
            assert fail == ("ok", ())
            outcomes.add("commit won")
        else:
            assert commit[:2] == ("error", "StaleAttemptError"), commit
            assert fail == ("ok", (txid,))
            assert pipeline.begin("p", txid, Fixed()).action.value == "replay"
            outcomes.add("failure won")
            new = pipeline.view("p").record(txid)
            assert new is not None and new.attempt == 2
            pipeline.mark_processed("p", txid, 2)
            assert pipeline.commit("p", txid, 2).applied
        assert pipeline.last_committed("p") == txid
    rows = sink(pipeline)
    assert [t for t, _ in rows] == sorted({t for t, _ in rows})  # never applied twice
    assert outcomes  # at least one ordering was exercised


def test_stale_attempt_commit_is_refused(pipeline):
    pipeline.begin("p", 1, Fixed())
    pipeline.mark_processed("p", 1, 1)
    pipeline.fail("p", 1, 1, error="worker lost")
    pipeline.begin("p", 1, Fixed())
    with pytest.raises(StaleAttemptError, match="current attempt is 2") as err:
        pipeline.commit("p", 1, 1)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 1, 1)
    assert sink(pipeline) == []


WORDS = [("apple", 1), ("dog", 2), ("man", 3)] * 500


def _stage_words(txlog, txid, attempt):
    words = MapState("p", "words", "transactional", keys={"word": "text"})

    def stage(conn):
        out = {words.output_key: words.stage(conn, txid, attempt, WORDS)}
        time.sleep(0.2)
        return out

    return txlog.stage_output("p", txid, attempt, stage).value


def test_duplicate_run_of_the_same_processing_attempt(pipeline, db_url):
    words = MapState("p", "words", "transactional", keys={"word": "text"}).create(pipeline.engine)
    pipeline.begin("p", 1, Fixed())
    results = race(db_url, (_stage_words, 1, 1), (_stage_words, 1, 1))
    assert sorted(results) == [("ok", "accept"), ("ok", "duplicate")]
    with pipeline.engine.connect() as conn:
        staged = conn.execute(text("SELECT count(*) FROM txn_stage_words")).scalar()
    assert staged == len(WORDS)  # replaced, not doubled
    result = commit_states(pipeline, "p", 1, 1, [words])
    assert result.details == {"words": {"staged_rows": len(WORDS), "keys": 3}}
    with pipeline.engine.connect() as conn:
        assert words.items(conn) == {("apple",): 500, ("dog",): 1000, ("man",): 1500}


def _slow_stage(txlog, txid, attempt):
    def stage(conn):
        time.sleep(1.0)  # a long COPY: it holds the txid's row, so no renewal gets through
        return {"rows": 1}

    return txlog.stage_output("p", txid, attempt, stage).value


def _expire_soon(txlog, txid, attempt):
    time.sleep(0.3)  # while the staging holds the row
    return txlog.expire_lease("p", txid, attempt)


def test_a_lease_that_ran_out_during_a_staging_fails_nothing_once_it_recorded(pipeline, db_url):
    """The sensor sees the lease of an attempt run out while that attempt stages its output (the
    staging blocks the renewals): the expiry waits for the txid's row and finds the output
    recorded, so it fails nothing, instead of failing a finished attempt and its cascade."""
    pipeline.begin("p", 1, Fixed())
    pipeline.begin("p", 2, Fixed())
    pipeline.renew_lease("p", 1, 1, holder="h", timeout=0)  # already run out
    staged, expired = race(db_url, (_slow_stage, 1, 1), (_expire_soon, 1, 1))
    assert staged == ("ok", "accept") and expired == ("ok", ()), (staged, expired)
    assert [(t.txid, t.status.value) for t in pipeline.transactions("p")] == [
        (1, "processed"),
        (2, "processing"),
    ]
    assert pipeline.expire_lease("p", 1, 1) == ()  # a processed attempt holds no lease
