"""One trigger that waits, without a worker slot, until the transaction log reaches a condition.

Triggers may run more than once, so this one only *reads* the log; every transition happens in
the operators' ``execute``/``execute_complete``. Each poll loads the pipeline's view through an
async (psycopg 3) connection and asks the coordinator's pure rules whether to wake.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_txn_provider.coordinator import (
    PipelineView,
    TxStatus,
    commit_gate,
    may_begin_now,
    txid_outcome,
)


class WaitFor(enum.StrEnum):
    CAN_BEGIN = "can_begin"
    """``txid`` may begin: ``txid - 1`` is (re-)initialised and the window has room."""
    COMMIT_GATE = "commit_gate"
    """``txid - 1`` committed (or the attempt went stale, or the txid committed)."""
    OUTCOME = "outcome"
    """The txid committed, or an attempt newer than ``attempt`` failed."""


def evaluate(
    wait_for: WaitFor, view: PipelineView, txid: int, attempt: int
) -> dict[str, Any] | None:
    """The event to fire now, or ``None`` to keep waiting (pure: unit-tested with plain views)."""
    if wait_for is WaitFor.CAN_BEGIN:
        return {"state": "can_begin"} if may_begin_now(view, txid) else None
    if wait_for is WaitFor.COMMIT_GATE:
        gate = commit_gate(view, txid, attempt)
        return None if gate.value == "wait" else {"state": gate.value}
    outcome = txid_outcome(view, txid)
    if outcome is TxStatus.COMMITTED:
        return {"state": "committed"}
    if outcome is TxStatus.FAILED:
        rec = view.record(txid)
        assert rec is not None
        if rec.attempt > attempt:
            return {"state": "failed", "attempt": rec.attempt}
    return None


class TxnLogTrigger(BaseTrigger):
    """Poll the log every ``poll_interval`` seconds until :func:`evaluate` returns an event.

    :param txn_log_conn_id: the ``txn_log`` connection.
    :param pipeline: pipeline name.
    :param txid: the txid the waiting task belongs to.
    :param attempt: the attempt it holds (``COMMIT_GATE``) or last handled (``OUTCOME``).
    :param wait_for: a :class:`WaitFor` value.
    :param end_task_on_commit: on "committed", end the waiting task successfully here in the
        triggerer (no worker slot, no task start): for a task with nothing left to do then.
    """

    def __init__(
        self,
        *,
        txn_log_conn_id: str,
        pipeline: str,
        txid: int,
        wait_for: WaitFor | str,
        attempt: int = 0,
        poll_interval: float = 1.0,
        end_task_on_commit: bool = False,
    ) -> None:
        super().__init__()
        self.end_task_on_commit = bool(end_task_on_commit)
        self.txn_log_conn_id = txn_log_conn_id
        self.pipeline = pipeline
        self.txid = int(txid)
        self.attempt = int(attempt)
        self.wait_for = WaitFor(wait_for)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "txn_log_conn_id": self.txn_log_conn_id,
                "pipeline": self.pipeline,
                "txid": self.txid,
                "attempt": self.attempt,
                "wait_for": self.wait_for.value,
                "poll_interval": self.poll_interval,
                "end_task_on_commit": self.end_task_on_commit,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from sqlalchemy.ext.asyncio import create_async_engine

        from airflow_txn_provider.hooks.txn_log import TxnLogHook
        from airflow_txn_provider.transaction_log import SNAPSHOT, load_view

        url = await TxnLogHook(txn_log_conn_id=self.txn_log_conn_id).async_sqlalchemy_url()
        # One snapshot per poll (see TransactionLog.view): the trigger only reads.
        engine = create_async_engine(url, pool_size=1, max_overflow=0, isolation_level=SNAPSHOT)
        pipeline = self.pipeline
        try:
            while True:
                async with engine.connect() as conn:
                    view = await conn.run_sync(lambda c: load_view(c, pipeline))
                event = evaluate(self.wait_for, view, self.txid, self.attempt)
                if event is not None:
                    self.log.info("pipeline=%s txid=%s: %s", pipeline, self.txid, event)
                    if self.end_task_on_commit and event["state"] == "committed":
                        yield TaskSuccessEvent()
                    else:
                        yield TriggerEvent({**event, "txid": self.txid})
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await engine.dispose()
