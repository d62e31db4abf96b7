"""Liveness against a real Postgres: calls that wait out a database restart instead of failing
(leases kept while alive and expired once the process is gone: test_lease.py)."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import BeginAction, TxStatus
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from txn_testing.postgres import EmbeddedPostgres


class Tens(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"start": (prev or {"end": 0})["end"], "end": txid * 10}


def test_calls_wait_out_a_postgres_crash_and_restart():
    """The log's Postgres crashes (immediate stop) for 3 s while txids begin and commit: every
    call waits and succeeds, nothing is lost or doubled."""
    # durable: a crash keeps every commit it acknowledged (the session's test server trades that
    # for speed, and would lose the last ones)
    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url, outage_timeout=60)
        txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
        crash = threading.Thread(target=pg.restart, args=(3.0,))
        started = time.monotonic()
        crash.start()
        for txid in range(1, 9):
            em = txlog.begin("p", txid, Tens())
            assert em.action in (BeginAction.NEW, BeginAction.RESUME)
            txlog.mark_processed("p", txid, em.attempt, {"n": txid})
            txlog.commit("p", txid, em.attempt)
        crash.join()
        assert time.monotonic() - started >= 3.0  # it did wait for the server
        infos = txlog.transactions("p")
        assert [(i.txid, i.attempt, i.status) for i in infos] == [
            (t, 1, TxStatus.COMMITTED) for t in range(1, 9)
        ]
        assert txlog.last_committed("p") == 8
        txlog.engine.dispose()


def test_without_retries_a_crash_is_an_error():
    """The control: the same crash with ``outage_timeout=0`` reaches the caller."""
    from sqlalchemy.exc import OperationalError

    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url, outage_timeout=0)
        txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
        pg.halt()
        with pytest.raises(OperationalError):
            txlog.begin("p", 1, Tens())
        pg.start()
        assert txlog.begin("p", 1, Tens()).action is BeginAction.NEW
        txlog.engine.dispose()


def test_a_psycopg2_url_opens_the_log_with_the_driver_it_stages_with(db_url):
    """``postgresql+psycopg2://`` names the same database: the log opens it with psycopg 3 (its
    binary COPY stages), and an engine of another driver is refused up front."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from airflow_txn_provider.state import MapState, stage_states

    url = make_url(db_url).set(drivername="postgresql+psycopg2").render_as_string(False)
    txlog = TransactionLog.from_url(url)
    assert txlog.engine.dialect.driver == "psycopg"
    txlog.register_pipeline("p3", source_kind="transactional", max_pending=2)
    counts = MapState("p3", "p3_counts", "transactional", keys={"w": "text"}).create(txlog.engine)
    em = txlog.begin("p3", 1, Tens())
    txlog.stage_output(
        "p3", 1, em.attempt, lambda c: stage_states(c, 1, em.attempt, {counts: [("a", 2)]})
    )
    assert txlog.transaction("p3", 1).status is TxStatus.PROCESSED
    txlog.engine.dispose()
    other = create_engine(url)
    with pytest.raises(ValueError, match="needs a postgresql\\+psycopg engine"):
        TransactionLog(other)
    with pytest.raises(ValueError, match="connects with psycopg "):
        TransactionLog.from_url(
            make_url(db_url).set(drivername="postgresql+pg8000").render_as_string(False)
        )
