"""The fill DAG's wait (triggers/fill.py) against a real Postgres, through the async driver: it
fires once an output of its pipeline fills from history, and not before."""

from __future__ import annotations

import asyncio

from airflow_txn_provider.triggers.fill import TxnFillDueTrigger
from tests.conftest import set_txn_log_connection
from tests.integration.transactions.test_output_lifecycle import P, a_state, b_state, declare, run


def test_the_wait_ends_when_an_output_starts_filling_from_history(txlog, db_url, monkeypatch):
    set_txn_log_connection(monkeypatch, "txn_fill_trigger", db_url)
    assert declare(txlog, [a_state()])
    run(txlog, 1)
    made = TxnFillDueTrigger(txn_log_conn_id="txn_fill_trigger", pipeline=P, poll_interval=0.05)
    path, kwargs = made.serialize()
    assert path == "airflow_txn_provider.triggers.fill.TxnFillDueTrigger"
    trigger = TxnFillDueTrigger(**kwargs)  # as the triggerer rebuilds it

    async def scenario():
        events = trigger.run()
        waiting = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the wait ended while no output fills"
        # an output added with start="next_txid" fills nothing: still waiting
        await asyncio.to_thread(declare, txlog, [a_state(), b_state()], start={"b": "next_txid"})
        await asyncio.sleep(0.5)
        assert not waiting.done(), "the wait ended for an output that does not fill"
        await asyncio.to_thread(declare, txlog, [a_state()], retired={"b": "drop"})
        await asyncio.to_thread(declare, txlog, [a_state(), b_state()], start={"b": "history"})
        event = await asyncio.wait_for(waiting, 10)
        await events.aclose()
        return event

    assert asyncio.run(scenario()).payload == {"filling": 1}
