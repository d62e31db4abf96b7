"""A rewind on Airflow: its runs restarted through the REST API, and the rewind's command line.

The rewind itself is the log's (:mod:`airflow_txn_provider.transactions.rewind`: states, lake
tables and txids put back in one database transaction); this module is the Airflow side of it, above
the log, so the log never imports Airflow's hooks. ``python -m airflow_txn_provider.rewind`` runs
:func:`main`.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Iterable

from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.rules.exceptions import TxnError
from airflow_txn_provider.timetables import TXID_STEP, txid_logical_date
from airflow_txn_provider.transactions.rewind import RewindResult, span


def restart_runs(api: AirflowApiHook, dag_ids: Iterable[str], result: RewindResult) -> list[str]:
    """Run every txid from ``result``'s ``to_txid`` again on each DAG that runs the pipeline,
    in txid order, through the REST API; returns what was cleared (``run_id: task_id``).

    Each run from ``to_txid`` on is cleared whole with its run reset to queued, which Airflow
    does to finished runs only (a reset run is scheduled before others, in logical-date order).
    A run still running would keep its ``max_active_runs`` slot while it waits for the txids
    before it, and with every slot so held the queued ones would never start: so, with the DAG
    paused meanwhile (no run is started or created halfway), the unfinished runs from
    ``to_txid`` on are ended first (their attempts were fenced by the rewind already)."""
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
        f"{result.last_committed_before}); txids {span(result.rewound)} pending again"
    )
    for name, counts in result.states.items():
        print(f"  state {name}: {counts['restored']} keys restored, {counts['removed']} removed")
    for name, what in result.tables.items():
        print(f"  lake sink {name}: {what}")
    if args.no_restart:
        print("no run restarted (--no-restart): restart them from the UI")
        return 0
    dag_ids = txlog.pipeline_dags().get(args.pipeline, set())
    cleared = restart_runs(AirflowApiHook(args.airflow_api_conn_id), dag_ids, result)
    print(f"restarted the runs of {sorted(dag_ids)}: {len(cleared)} task instances cleared")
    return 0


__all__ = ["main", "restart_runs"]


if __name__ == "__main__":
    raise SystemExit(main())
