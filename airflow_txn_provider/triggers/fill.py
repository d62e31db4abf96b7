"""The fill DAG's wait: until an output of the pipeline fills from history.

A pipeline that declares an output with ``start={name: "history"}`` gets a fill DAG
(:func:`~airflow_txn_provider.dag_builder.build_fill_dag`) whose one task waits here, in the
triggerer, while nothing fills: one small query every ``poll_interval`` seconds, no worker slot.
When an output fills, the task wakes on a worker and fills it
(:class:`~airflow_txn_provider.operators.fill.TxnFillOperator`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from sqlalchemy import func, select

from airflow_txn_provider.log.models import OUTPUTS
from airflow_txn_provider.rules.vocabulary import OutputStart
from airflow_txn_provider.triggers.txn_log import shared_engine
from airflow_txn_provider.utils.retries import is_transient

FILL_POLL_INTERVAL = 30.0
"""Seconds between the idle fill task's looks at the log: an output added with ``history`` starts
filling within this much (the fill task also fills at once when it starts)."""


class TxnFillDueTrigger(BaseTrigger):
    """Fire ``{"filling": n}`` once ``n > 0`` outputs of ``pipeline`` fill from history.

    :param txn_log_conn_id: the ``txn_log`` connection.
    :param pipeline: pipeline name.
    :param poll_interval: seconds between looks (> 0).
    """

    def __init__(
        self, *, txn_log_conn_id: str, pipeline: str, poll_interval: float = FILL_POLL_INTERVAL
    ) -> None:
        super().__init__()
        if not float(poll_interval) > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.txn_log_conn_id = txn_log_conn_id
        self.pipeline = pipeline
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "txn_log_conn_id": self.txn_log_conn_id,
                "pipeline": self.pipeline,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        url = await TxnLogHook(txn_log_conn_id=self.txn_log_conn_id).async_sqlalchemy_url()
        engine = shared_engine(url)
        query = select(func.count()).where(
            (OUTPUTS.c.pipeline == self.pipeline)
            & (OUTPUTS.c.start == OutputStart.HISTORY)
            & OUTPUTS.c.live_from_txid.is_not(None)
            & OUTPUTS.c.joined_after_txid.is_(None)
            & OUTPUTS.c.retired_at.is_(None)
        )
        while True:
            try:
                async with engine.connect() as conn:
                    filling = int((await conn.execute(query)).scalar() or 0)
            except Exception as err:
                if not is_transient(err):
                    raise
                self.log.warning("pipeline=%s: the log is unreachable (%s)", self.pipeline, err)
                filling = 0
            if filling:
                yield TriggerEvent({"filling": filling})
                return
            await asyncio.sleep(self.poll_interval)


__all__ = ["FILL_POLL_INTERVAL", "TxnFillDueTrigger"]
