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

Then the txids recompute through the normal path, possibly with a changed job: on Airflow,
:func:`restart_runs` puts their runs back in the queue, every task cleared, through the REST API.
From a shell where Airflow's connections are configured (a scheduler's or a worker's)::

    python -m airflow_txn_provider.rewind PIPELINE --to N [--by WHO] [--job-version V]
        [--reason WHY] [--txn-log-conn-id ID] [--airflow-api-conn-id ID] [--no-restart]

or from the plugin's API (:mod:`airflow_txn_provider.ui.actions`). Lake tables (Delta, Iceberg)
are not rolled back by this version: a rewind over a txid that wrote one is refused
(:class:`~airflow_txn_provider.exceptions.RewindLakeSinkError`).
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Iterable, Mapping
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

    from airflow_txn_provider.hooks.airflow_api import AirflowApiHook

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


def restart_runs(api: AirflowApiHook, dag_ids: Iterable[str], result: RewindResult) -> list[str]:
    """Run every txid from ``result``'s ``to_txid`` again on each DAG that runs the pipeline,
    in txid order, through the REST API; returns what was cleared (``run_id: task_id``).

    Each run from ``to_txid`` on is cleared whole with its run reset to queued, which Airflow
    does to finished runs only (a reset run is scheduled before others, in logical-date order).
    A run still running would keep its ``max_active_runs`` slot while it waits for the txids
    before it, and with every slot so held the queued ones would never start: so, with the DAG
    paused meanwhile (no run is started or created halfway), the unfinished runs from
    ``to_txid`` on are ended first (their attempts were fenced by the rewind already)."""
    from airflow_txn_provider.timetables import TXID_STEP, txid_logical_date

    if not result.rewound:
        return []
    start = txid_logical_date(result.to_txid)
    # every run from to_txid on, those created after the rewound ones included
    end = start + TXID_STEP * 10**9
    note = f"rewound to txid {result.to_txid}: recomputed from it, in order"
    cleared: list[str] = []
    for dag_id in sorted(dag_ids):
        was_paused = api.set_paused(dag_id, True)
        try:
            for run_id in api.unfinished_runs_from(dag_id, start):
                api.set_run_state(dag_id, run_id, "failed")
            cleared += api.clear_task_instances(
                dag_id,
                api.task_ids(dag_id),
                logical_dates=(start, end),
                note=note,
                reset_dag_runs=True,
            )
        finally:
            if not was_paused:
                api.set_paused(dag_id, False)
    return cleared


def main(argv: list[str] | None = None) -> int:
    """The rewind's command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_txn_provider.rewind",
        description="Rewind a pipeline to txid N: its Postgres states back to after N - 1, "
        "every txid from N recomputed (their Airflow runs restarted).",
    )
    parser.add_argument("pipeline")
    parser.add_argument(
        "--to", type=int, required=True, metavar="N", help="the first txid to recompute"
    )
    parser.add_argument("--by", default=f"cli:{getpass.getuser()}", help="who rewinds (recorded)")
    parser.add_argument("--job-version", help="the job version that recomputes (recorded)")
    parser.add_argument("--reason", help="why (recorded, and shown on the rewound txids)")
    parser.add_argument("--txn-log-conn-id", default="txn_log_default")
    parser.add_argument("--airflow-api-conn-id", default="airflow_api_default")
    parser.add_argument(
        "--no-restart", action="store_true", help="rewind the log only; restart no Airflow run"
    )
    args = parser.parse_args(argv)
    from airflow_txn_provider.exceptions import TxnError
    from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
    from airflow_txn_provider.hooks.txn_log import TxnLogHook

    try:
        txlog = TxnLogHook(args.txn_log_conn_id).get_log()
        result = txlog.rewind(
            args.pipeline, args.to, by=args.by, job_version=args.job_version, reason=args.reason
        )
    except TxnError as err:
        print(f"rewind refused: {err}", file=sys.stderr)
        return 2
    print(
        f"{result.pipeline}: rewound to txid {result.to_txid} (last committed was "
        f"{result.last_committed_before}); txids {_span(result.rewound)} pending again"
    )
    for name, counts in result.states.items():
        print(f"  state {name}: {counts['restored']} keys restored, {counts['removed']} removed")
    if args.no_restart:
        print("no run restarted (--no-restart): restart them from the UI")
        return 0
    dag_ids = txlog.pipeline_dags().get(args.pipeline, set())
    cleared = restart_runs(AirflowApiHook(args.airflow_api_conn_id), dag_ids, result)
    print(f"restarted the runs of {sorted(dag_ids)}: {len(cleared)} task instances cleared")
    return 0


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


__all__ = ["LogRewind", "RewindResult", "main", "restart_runs"]


if __name__ == "__main__":
    raise SystemExit(main())
