"""The fast chaos tier's CI subset: a few fixed-seed runs of chaos/fast.py (no Airflow).

Real worker processes on the session's Spark Connect server, a durable Postgres of its own for the
log (the faults crash it). Seed 16's four runs cover a worker killed mid-job, the log's Postgres
crashed and restarted, and both in one run. ``python chaos/fast.py --seed 16 --runs 4`` replays
them; ``make chaos-fast`` runs the whole tier.

The lake-sink subset: one run per sink kind, the word count also committed into a Delta table
(seed 19: a worker killed mid-job, a committer killed between the table's commit and the log's)
and an Iceberg table whose catalog is in the log's Postgres (seed 37: a committer killed there,
the log's Postgres crashed). ``python chaos/fast.py --seed 19 --runs 1 --sink delta`` (and
``--seed 37 ... --sink iceberg``) replays them; ``make chaos-lake`` runs 20 of each.
"""

from __future__ import annotations

import io

import pytest

from chaos.fast import (
    FAULTS,
    KILL,
    KILL_COMMITTER,
    RESTART_LOG,
    SINK_FAULTS,
    plan_run,
    run_seeds,
    run_suite,
)
from chaos.report import FaultResult, print_table

SEED = 16
RUNS = 4
TXIDS = 4
LAKE_SEEDS = {"delta": 19, "iceberg": 37}
"""One run per sink kind (``--runs 1``: the run's seed is the master seed)."""


def _report(results: list[FaultResult], lines: list[str], title: str) -> str:
    table = io.StringIO()
    print_table(results, title=title, file=table)
    return "\n".join([*lines, table.getvalue()])


def test_the_subset_covers_both_faults():
    plans = [plan_run(seed, TXIDS, FAULTS) for seed in run_seeds(SEED, RUNS)]
    names = {plan.fault_name for plan in plans}
    assert {KILL, RESTART_LOG, f"{KILL} + {RESTART_LOG}"} <= names, names


def test_every_run_recovers_with_nothing_lost_or_doubled(connect_server):
    lines: list[str] = []
    results = run_suite(
        RUNS, SEED, txids=TXIDS, spark_url=connect_server.url, progress=lines.append
    )
    report = _report(results, lines, f"fast chaos subset, master seed {SEED}")
    print(report)
    assert len(results) == RUNS
    assert all(r.recovered for r in results), report
    assert sum(r.records_lost for r in results) == 0, report
    assert sum(r.records_doubled for r in results) == 0, report


def test_the_lake_subset_covers_every_fault():
    plans = {sink: plan_run(seed, TXIDS, SINK_FAULTS) for sink, seed in LAKE_SEEDS.items()}
    assert {f.kind for f in plans["delta"].faults} == {KILL, KILL_COMMITTER}, plans
    assert {f.kind for f in plans["iceberg"].faults} == {KILL_COMMITTER, RESTART_LOG}, plans


@pytest.mark.parametrize("sink", sorted(LAKE_SEEDS))
def test_a_lake_run_recovers_with_nothing_lost_or_doubled_in_the_table(sink, connect_server):
    seed = LAKE_SEEDS[sink]
    lines: list[str] = []
    results = run_suite(
        1, seed, txids=TXIDS, sink=sink, spark_url=connect_server.url, progress=lines.append
    )
    report = _report(results, lines, f"fast chaos lake subset, sink {sink}, seed {seed}")
    print(report)
    [result] = results
    assert result.recovered, report
    assert result.records_lost == 0 and result.records_doubled == 0, report
    lake = result.extra["lake"]
    assert isinstance(lake, dict), report
    # The table was checked, not only the state: one row per (txid, word), none missing.
    assert lake["lost"] == 0 and lake["doubled"] == 0, report
    assert lake["pairs_missing"] == 0 and lake["pairs_twice"] == 0, report
    assert lake["table_txid"] == TXIDS and lake["rows"] > 0, report
    # Every planned fault fired; the killed committer's txid was found in the table on retry.
    events = result.extra["events"]
    assert isinstance(events, dict), report
    assert not any(name.endswith("not injected") for name in events), report
    assert events.get("commit found its txid in the table", 0) >= 1, report
