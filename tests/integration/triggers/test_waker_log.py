"""The waker's reads of the log on a real Postgres, above all on a new deployment's log, which has
no tables until something migrates it (found by the container stack's first run: the waker read
a missing table forever, and no run was ever created to migrate it)."""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, inspect

from airflow_txn_provider.log.schema import HEAD_REVISION, VERSION_TABLE
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.waiting import new_txid_due
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.triggers.waker import TxnWakerTrigger
from tests.conftest import new_database, set_txn_log_connection


class Numbers(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"n": txid}


def waker(pipeline: str) -> TxnWakerTrigger:
    return TxnWakerTrigger(
        txn_log_conn_id="txn_waker",
        airflow_api_conn_id="airflow_api_default",
        pipeline=pipeline,
        dag_id=pipeline,
        source={},
        poll_interval=0.1,
    )


def test_the_waker_migrates_a_new_log_then_finds_txid_1_due(postgres, monkeypatch):
    url = new_database(postgres, migrated=False)
    set_txn_log_connection(monkeypatch, "txn_waker", url)
    engine = create_engine(url)
    assert VERSION_TABLE not in inspect(engine).get_table_names()  # a new deployment's log

    async def first_look():
        read_view = await waker("fresh").log_reader()
        return await read_view()

    view = asyncio.run(first_look())
    assert view is None and new_txid_due(view) == 1  # nothing declared: txid 1 is due
    with engine.connect() as conn:
        assert (
            conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalar()
            == HEAD_REVISION
        )
    engine.dispose()


def test_the_waker_reads_a_declared_pipelines_view(db_url, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_waker", db_url)
    txlog = TransactionLog.from_url(db_url)
    txlog.register_pipeline("declared", source_kind="transactional", max_pending=2)
    assert txlog.begin_next("declared", Numbers()).emitted

    async def look():
        read_view = await waker("declared").log_reader()
        return await read_view()

    view = asyncio.run(look())
    assert view is not None and new_txid_due(view) == 2
    txlog.engine.dispose()


def test_the_runs_a_claim_made_are_noted_and_never_lowered(txlog):
    txlog.register_pipeline("ahead", source_kind="transactional", max_pending=3)
    assert txlog.begin_next("ahead", Numbers()).emitted
    assert txlog.view("ahead").runs_made_through == 0
    txlog.note_runs_made("ahead", 4)
    txlog.note_runs_made("ahead", 3)  # a slower claim's older note
    view = txlog.view("ahead")
    assert view.runs_made_through == 4 and new_txid_due(view) == 2  # the waker skips it a while


def test_a_run_made_ahead_waits_in_its_worker_for_the_begin_before_it(txlog):
    import threading
    import time

    from airflow_txn_provider.run_context import previous_began

    txlog.register_pipeline("race", source_kind="transactional", max_pending=3)
    assert txlog.begin("race", 1, Numbers()).emitted
    assert not txlog.begin("race", 3, Numbers()).emitted  # txid 2 has not begun
    later = threading.Timer(0.5, lambda: txlog.begin("race", 2, Numbers()))
    later.start()
    started = time.monotonic()
    assert previous_began(txlog, "race", 3, time.monotonic() + 30)
    assert 0.4 < time.monotonic() - started < 10
    later.join()
    assert txlog.begin("race", 3, Numbers()).emitted
    # a txid whose previous began long ago but failed waits in its trigger, not here
    txlog.fail("race", 2, 1, error="boom")
    started = time.monotonic()
    assert not previous_began(txlog, "race", 4, time.monotonic() + 30)
    assert time.monotonic() - started < 5
