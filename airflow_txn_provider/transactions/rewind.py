"""Rewind: recompute a pipeline from txid N, its states restored exactly to after N - 1.

In one database transaction under the pipeline's lock (a crash leaves the old log and states or
the rewound ones), a rewind:

1. checks that ``N`` can be restored exactly, within reach of retention and the undo records
   (:func:`~airflow_txn_provider.rules.history.plan_rewind`);
2. puts every Postgres map state back as after ``N - 1``, from the commits' undo records
   (:meth:`~airflow_txn_provider.state.MapState.rewind`);
3. fails the current attempt of every txid from ``N`` on and moves the last committed txid to
   ``N - 1``: each replays in order with a new attempt, and a stale one commits nothing;
4. records who, when, from which txid, with which job version (``txn_rewind``).

On Airflow, :func:`~airflow_txn_provider.rewind.restart_runs` then restarts their runs. Lake tables
follow to the version stamped ``N - 1`` (:meth:`LogRewind.follow_lake_tables`), or their next
commit rolls them back (:func:`read_rewound_through`); until then a read as of the last committed
txid sees them as after N - 1.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update

from airflow_txn_provider.log.fill_progress import rewind_fills
from airflow_txn_provider.log.models import PIPELINES, REWINDS
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import TxidRows, load_view, lock_pipeline
from airflow_txn_provider.rules.history import plan_rewind, rewind_floor, rewound_through
from airflow_txn_provider.transactions.apply import rewind_states, rewind_tables
from airflow_txn_provider.utils.retries import retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


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
    tables: Mapping[str, str] = field(default_factory=dict)
    """Per lake sink the rewound txids wrote: what :meth:`LogRewind.follow_lake_tables` did."""


class LogRewind(LogPart):
    """Rewinding a pipeline to txid N, and the lake tables following it."""

    def rewind(
        self,
        pipeline: str,
        to_txid: int,
        *,
        by: str,
        job_version: str | None = None,
        reason: str | None = None,
    ) -> RewindResult:
        """Rewind ``pipeline`` to ``to_txid`` (see the module's docstring): the log and every
        Postgres state in one database transaction, then the lake tables. Raises
        :class:`~airflow_txn_provider.rules.exceptions.RewindTooFarError` below the oldest txid it
        can restore exactly (the error says which),
        :class:`~airflow_txn_provider.rules.exceptions.RewindAheadError` past the oldest uncommitted
        txid; nothing changes then."""
        if not by:
            raise ValueError("a rewind names who does it (by=)")
        result = self._rewind_log(pipeline, to_txid, by, job_version, reason)
        tables = self.follow_lake_tables(pipeline) if result.rewound else {}
        return replace(result, tables=tables)

    @retry_transient
    def follow_lake_tables(self, pipeline: str) -> dict[str, str]:
        """Take every lake table a txid after the log's last committed one wrote back to that
        txid, under the pipeline's lock (no commit runs meanwhile); returns what happened per
        sink. Idempotent: a table at the txid already is left alone. Never raises for a table:
        one that cannot be rolled back now is rolled back by its next commit (see the module's
        docstring), and a reader as of the last committed txid reads it right meanwhile."""
        log_url = self.engine.url.render_as_string(hide_password=False)
        with self.engine.begin() as conn:
            keep = int(lock_pipeline(conn, pipeline).last_committed_txid)
            return rewind_tables(conn, pipeline, keep, log_url)

    @retry_transient
    def _rewind_log(
        self,
        pipeline: str,
        to_txid: int,
        by: str,
        job_version: str | None,
        reason: str | None,
    ) -> RewindResult:
        with self.engine.begin() as conn:
            row = lock_pipeline(conn, pipeline)
            view = load_view(conn, pipeline)
            floor = rewind_floor(int(row.pruned_through_txid), int(row.undo_from_txid))
            plan = plan_rewind(view, to_txid, floor=floor)
            states = rewind_states(conn, pipeline, to_txid)
            # an output filling from history resumes from there (its values went back above)
            fills = rewind_fills(conn, pipeline, to_txid)
            if fills:
                log.warning("pipeline=%s fills from history resume after %s", pipeline, fills)
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
            span(plan.failed),
            states,
        )
        return RewindResult(pipeline, to_txid, view.last_committed, plan.failed, states)


def read_rewound_through(conn: Connection, pipeline: str) -> int:
    """The newest txid a rewind of ``pipeline`` failed (0: never rewound): the rule's input,
    :func:`~airflow_txn_provider.rules.history.rewound_through`."""
    rows = conn.execute(
        select(REWINDS.c.to_txid, REWINDS.c.rewound_txids).where(REWINDS.c.pipeline == pipeline)
    )
    return rewound_through((int(to), int(n)) for to, n in rows)


def span(txids: tuple[int, ...]) -> str:
    """``first..last`` of ``txids`` (``(none)`` when empty), as logs and the CLI print them."""
    return f"{txids[0]}..{txids[-1]}" if txids else "(none)"


__all__ = ["LogRewind", "RewindResult", "read_rewound_through", "span"]
