"""The fast chaos tier's CI subset: a few fixed-seed runs of chaos/fast.py (no Airflow).

Real worker processes on the session's Spark Connect server, a durable Postgres of its own for the
log (the faults crash it). Seed 16's four runs cover a worker killed mid-job, the log's Postgres
crashed and restarted, and both in one run. ``python chaos/fast.py --seed 16 --runs 4`` replays
them; ``make chaos-fast`` runs the whole tier.
"""

from __future__ import annotations

import io

from chaos.fast import FAULTS, KILL, RESTART_LOG, plan_run, run_seeds, run_suite
from chaos.report import print_table

SEED = 16
RUNS = 4
TXIDS = 4


def test_the_subset_covers_both_faults():
    plans = [plan_run(seed, TXIDS, FAULTS) for seed in run_seeds(SEED, RUNS)]
    names = {plan.fault_name for plan in plans}
    assert {KILL, RESTART_LOG, f"{KILL} + {RESTART_LOG}"} <= names, names


def test_every_run_recovers_with_nothing_lost_or_doubled(connect_server):
    lines: list[str] = []
    results = run_suite(
        RUNS, SEED, txids=TXIDS, spark_url=connect_server.url, progress=lines.append
    )
    table = io.StringIO()
    print_table(results, title=f"fast chaos subset, master seed {SEED}", file=table)
    report = "\n".join([*lines, table.getvalue()])
    print(report)
    assert len(results) == RUNS
    assert all(r.recovered for r in results), report
    assert sum(r.records_lost for r in results) == 0, report
    assert sum(r.records_doubled for r in results) == 0, report
