"""Deferred waits share one pool per triggerer: many triggers of a pipeline, polling hard, hold
at most ``[txn_provider] trigger_pool_size`` connections to the log (counted by the real Postgres
server), and every one still wakes when its condition holds."""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor
from tests.conftest import set_txn_log_connection

TRIGGERS = 12
POOL = 2


class Numbers(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"n": txid}


async def first_event(trigger):
    """The first event ``trigger`` fires (then its generator is closed, as the triggerer does)."""
    events = trigger.run()
    try:
        return await events.__anext__()
    finally:
        await events.aclose()


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
        waits = [asyncio.ensure_future(first_event(t)) for t in triggers]
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


def test_the_triggers_of_a_pipeline_share_one_look_at_the_log_per_interval(
    txlog, db_url, monkeypatch
):
    """Twelve waits of one pipeline (a failure watch per txid in flight) read its view about once
    per poll_interval between them, not twelve times: what an idle or busy pipeline costs the
    log does not grow with the tasks that wait on it."""
    from airflow_txn_provider.log import rows as log_rows
    from airflow_txn_provider.triggers import txn_log as txn_log_triggers

    set_txn_log_connection(monkeypatch, "txn_share", db_url)
    txlog.register_pipeline("share", source_kind="transactional", max_pending=TRIGGERS)
    for _ in range(TRIGGERS):
        assert txlog.begin_next("share", Numbers()).emitted
    reads = []
    real = log_rows.load_view

    def counted(conn, pipeline, **kw):
        reads.append(pipeline)
        return real(conn, pipeline, **kw)

    monkeypatch.setattr(txn_log_triggers, "load_view", counted)
    interval, seconds = 0.2, 3.0
    triggers = [
        TxnLogTrigger(
            txn_log_conn_id="txn_share",
            pipeline="share",
            txid=txid,
            attempt=0,
            wait_for=WaitFor.OUTCOME,
            poll_interval=interval,
        )
        for txid in range(1, TRIGGERS + 1)
    ]

    async def scenario():
        waits = [asyncio.ensure_future(first_event(t)) for t in triggers]
        await asyncio.sleep(seconds)
        assert not any(w.done() for w in waits), "a watch woke with nothing to report"
        await asyncio.to_thread(txlog.fail, "share", 1, 1, error="boom")  # fails all twelve
        events = await asyncio.wait_for(asyncio.gather(*waits), 30)
        return events

    events = asyncio.run(scenario())
    per_interval = len(reads) / ((seconds + 1) / interval)
    print(f"{len(triggers)} watches read the view {len(reads)} times: {per_interval:.2f} a poll")
    # one look per interval (a little more: the loops are not aligned), never one per trigger
    assert len(reads) <= 2 * (seconds + 2) / interval < TRIGGERS * seconds / interval / 2
    assert sorted(e.payload["txid"] for e in events) == list(range(1, TRIGGERS + 1))
    assert {e.payload["state"] for e in events} == {"failed"}
