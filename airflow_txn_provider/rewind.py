"""Rewind: recompute a pipeline from txid N, its states restored exactly to after N - 1.

The most common reason to reprocess is a transform that was wrong from txid N on. A rewind, in
one database transaction under the pipeline's lock (so no commit runs beside it, and a crash
leaves either the old log and states or the rewound ones):

1. asks the coordinator (:func:`~airflow_txn_provider.coordinator.plan_rewind`) whether ``N``
   can be restored exactly: no further back than retention and the undo records reach
   (:func:`~airflow_txn_provider.coordinator.rewind_floor`);
2. puts every Postgres map state of the pipeline back as it was after ``N - 1``'s commit, from
   the undo records each commit writes in its apply statement (a key's row before the commit:
   :meth:`~airflow_txn_provider.state.MapState.rewind`);
3. fails the current attempt of every txid from ``N`` on, committed or in flight, and moves the
   last committed txid to ``N - 1``: each replays in order with a new attempt (a transactional
   source reads the same batch, an opaque one reads again from where ``N - 1`` ended), and a
   stale attempt still running can commit nothing (its attempt is no longer current);
4. records who rewound, when, from which txid, with which job version (``txn_rewind``).

Then the txids recompute through the normal path, possibly with a changed job: on Airflow, their
runs are restarted (:mod:`airflow_txn_provider.hooks.airflow_api`, by the CLI:
``python -m airflow_txn_provider.rewind``). Lake tables (Delta, Iceberg) are not rolled back by
this version: a rewind over a txid that wrote one is refused (:class:`RewindLakeSinkError`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update

from airflow_txn_provider.coordinator import plan_rewind, rewind_floor
from airflow_txn_provider.exceptions import RewindLakeSinkError
from airflow_txn_provider.log_rows import TxidRows, load_view, lock_pipeline
from airflow_txn_provider.models import PIPELINES, REWINDS, TRANSACTIONS
from airflow_txn_provider.retries import retry_transient
from airflow_txn_provider.vocabulary import LAKE_OUTPUT_PREFIX

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewindResult:
    pipeline: str
    to_txid: int
    last_committed_before: int
    rewound: tuple[int, ...]
    """The txids pending again (the rolled back ones, then those that were in flight)."""
    states: Mapping[str, Mapping[str, int]]
    """Per state: ``{"restored": keys, "removed": keys}``."""


class LogRewind:
    """The rewind room of :class:`~airflow_txn_provider.transaction_log.TransactionLog`."""

    engine: Engine
    outage_timeout: float

    @retry_transient
    def rewind(
        self,
        pipeline: str,
        to_txid: int,
        *,
        by: str,
        job_version: str | None = None,
        reason: str | None = None,
    ) -> RewindResult:
        """Rewind ``pipeline`` to ``to_txid`` (see the module's docstring): one database
        transaction. Raises :class:`~airflow_txn_provider.exceptions.RewindTooFarError` below
        the oldest txid it can restore exactly (the error says which),
        :class:`~airflow_txn_provider.exceptions.RewindAheadError` past the oldest uncommitted
        txid, :class:`RewindLakeSinkError` over a txid that wrote a lake table; nothing changes
        then."""
        from airflow_txn_provider.state import load_states

        if not by:
            raise ValueError("a rewind names who does it (by=)")
        with self.engine.begin() as conn:
            row = lock_pipeline(conn, pipeline)
            view = load_view(conn, pipeline)
            floor = rewind_floor(int(row.pruned_through_txid), int(row.undo_from_txid))
            plan = plan_rewind(view, to_txid, floor=floor)
            _refuse_lake_tables(conn, pipeline, plan.rolled_back)
            states = {
                name: state.rewind(conn, to_txid)
                for name, state in sorted(load_states(conn, pipeline).items())
            }
            why = f"rewound to txid {to_txid} by {by}" + (f": {reason}" if reason else "")
            failed = TxidRows.rewind(conn, pipeline, to_txid, why)
            conn.execute(
                update(PIPELINES)
                .where(PIPELINES.c.name == pipeline)
                .values(last_committed_txid=plan.last_committed)
            )
            conn.execute(
                insert(REWINDS).values(
                    pipeline=pipeline,
                    to_txid=to_txid,
                    last_committed_txid=view.last_committed,
                    rewound_txids=failed,
                    by=by,
                    job_version=job_version,
                    reason=reason,
                    states=states,
                )
            )
        log.warning(
            "pipeline=%s rewound to txid %s by %s (last committed was %s): txids %s pending "
            "again; states %s",
            pipeline,
            to_txid,
            by,
            view.last_committed,
            _span(plan.failed),
            states,
        )
        return RewindResult(pipeline, to_txid, view.last_committed, plan.failed, states)


def _refuse_lake_tables(conn: Connection, pipeline: str, txids: range) -> None:
    if not txids:
        return
    outputs = conn.execute(
        select(TRANSACTIONS.c.txid, TRANSACTIONS.c.output).where(
            TRANSACTIONS.c.pipeline == pipeline,
            TRANSACTIONS.c.txid.between(txids.start, txids.stop - 1),
        )
    )
    for txid, output in outputs:
        sinks = [
            k[len(LAKE_OUTPUT_PREFIX) :] for k in output or {} if k.startswith(LAKE_OUTPUT_PREFIX)
        ]
        if sinks:
            raise RewindLakeSinkError(
                f"txid {txid} wrote lake table(s) {sinks}: this version rewinds Postgres states "
                "only, and a table left ahead of the log would refuse the next commit",
                pipeline=pipeline,
                txid=txid,
                sink=sinks[0],
            )


def _span(txids: tuple[int, ...]) -> str:
    return f"{txids[0]}..{txids[-1]}" if txids else "(none)"


__all__ = ["LogRewind", "RewindResult"]
