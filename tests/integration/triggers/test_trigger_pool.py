"""Deferred waits share one pool per triggerer: many triggers of a pipeline, polling hard, hold
at most ``[txn_provider] trigger_pool_size`` connections to the log (counted by the real Postgres
server), and every one still wakes when its condition holds."""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, text

from airflow_txn_provider.sources import TransactionalSource
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from tests.conftest import set_txn_log_connection

TRIGGERS = 12
POOL = 2


class Numbers(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"n": txid}


def test_many_triggers_share_a_bounded_pool(txlog, db_url, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_pool", db_url)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__TRIGGER_POOL_SIZE", str(POOL))
    txlog.register_pipeline("pool", source_kind="transactional", max_pending=TRIGGERS)
    for txid in range(1, TRIGGERS + 1):
        assert txlog.begin_next("pool", Numbers()).emitted
        txlog.mark_processed("pool", txid, 1, {"n": txid})
    # every txid waits for its turn to commit (its commit gate), as max_pending commit tasks do
    triggers = [
        TxnLogTrigger(
            txn_log_conn_id="txn_pool",
            pipeline="pool",
            txid=txid,
            attempt=1,
            wait_for=WaitFor.COMMIT_GATE,
            poll_interval=0.01,
        )
        for txid in range(2, TRIGGERS + 1)
    ]
    database = db_url.rsplit("/", 1)[1]
    watcher = create_engine(db_url.rsplit("/", 1)[0] + "/postgres")

    def connections() -> int:
        with watcher.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
                        "AND pid <> pg_backend_pid()"
                    ),
                    {"d": database},
                ).scalar_one()
            )

    baseline = connections()  # the test's own (sync) log engine

    async def scenario():
        async def first(trigger):
            events = trigger.run()
            try:
                return await events.__anext__()
            finally:
                await events.aclose()

        waits = [asyncio.ensure_future(first(t)) for t in triggers]
        most = 0
        for _ in range(20):  # they all poll meanwhile: none may open a connection of its own
            await asyncio.sleep(0.05)
            most = max(most, await asyncio.to_thread(connections) - baseline)
        assert not any(w.done() for w in waits), "a gate opened before its predecessor committed"
        for txid in range(1, TRIGGERS + 1):
            await asyncio.to_thread(txlog.commit, "pool", txid, 1)
        events = await asyncio.wait_for(asyncio.gather(*waits), 60)
        return most, events

    most, events = asyncio.run(scenario())
    print(f"{len(triggers)} triggers polling every 10 ms held at most {most} connections")
    assert 1 <= most <= POOL
    assert [e.payload["txid"] for e in events] == list(range(2, TRIGGERS + 1))
    assert {e.payload["state"] for e in events} <= {"open", "committed"}
    watcher.dispose()
