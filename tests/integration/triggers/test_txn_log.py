"""The log trigger against a real Postgres: a real poll through the async driver."""

from __future__ import annotations

import asyncio

from airflow_txn_provider.triggers.txn_log import TxnLogTrigger, WaitFor


def test_trigger_wakes_when_previous_txid_commits(txlog, db_url, monkeypatch):
    """A real poll through the async driver: the gate of txid 2 opens once txid 1 commits."""
    from airflow_txn_provider.rules.sources import TransactionalSource
    from tests.conftest import set_txn_log_connection

    class Numbers(TransactionalSource):
        def initialize_transaction(self, txid, prev):
            return {"n": txid}

    set_txn_log_connection(monkeypatch, "txn_trigger", db_url)
    txlog.register_pipeline("gate", source_kind="transactional", max_pending=3)
    for _ in range(2):
        assert txlog.begin_next("gate", Numbers()).emitted
    txlog.mark_processed("gate", 1, 1, {"n": 1})
    txlog.mark_processed("gate", 2, 1, {"n": 2})
    trigger = TxnLogTrigger(
        txn_log_conn_id="txn_trigger",
        pipeline="gate",
        txid=2,
        attempt=1,
        wait_for=WaitFor.COMMIT_GATE,
        poll_interval=0.05,
    )

    async def scenario():
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the gate opened before txid 1 committed"
        await asyncio.to_thread(txlog.commit, "gate", 1, 1)
        event = await asyncio.wait_for(waiting, 10)
        await events.aclose()
        return event

    event = asyncio.run(scenario())
    assert event.payload == {"state": "open", "txid": 2}
