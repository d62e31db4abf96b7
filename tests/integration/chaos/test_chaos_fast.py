"""The fast chaos tier's CI subset: a few fixed-seed runs of chaos/fast.py (no Airflow).

Real worker processes on the session's Spark Connect server, a durable Postgres of its own for the
log (the faults crash it). Seed 19's four runs of three txids cover a worker killed mid-job, the
log's Postgres crashed and restarted, and a Postgres backend SIGKILLed (crash recovery while the
server stays up: the UNLOGGED staging tables come back empty) at each of its points: inside a
worker's staging, between the two jobs of a two-job txid, between a txid's processed output and its
commit, and inside the commit. ``python chaos/fast.py --seed 19 --runs 4 --txids 3`` replays them;
``make chaos-fast`` runs the whole tier.

The lake-sink subset: one run per sink kind, the word count also committed into two lake tables
with an opaque source that grows while the run goes (a replay takes more records than the attempt
it replaces), the second table's commit failing after the first's (its staged files lost): a
Delta pair (seed 112: that, and a backend killed inside a commit) and an Iceberg pair whose
catalog is in the log's Postgres (seed 37: that, and a committer killed between the first
table's commit and the log's). ``python chaos/fast.py --seed 112 --runs 1 --sink delta`` (and
``--seed 37 ... --sink iceberg``) replays them; ``make chaos-lake`` runs 20 of each.
"""

from __future__ import annotations

import io

import pytest

from chaos.fast import (
    BACKEND_POINTS,
    FAIL_SINK,
    FAULTS,
    KILL,
    KILL_BACKEND,
    KILL_COMMITTER,
    RESTART_LOG,
    SINK_FAULTS,
    plan_run,
    run_seeds,
    run_suite,
)
from chaos.report import FaultResult, print_table

SEED = 19
RUNS = 4
TXIDS = 3
LAKE_TXIDS = 4
"""The lake runs' txids: their seeds draw their faults for four (an opaque source's run with fewer
leaves a txid that the cascade failed and no data can replay)."""
LAKE_SEEDS = {"delta": 112, "iceberg": 37}
"""One run per sink kind (``--runs 1``: the run's seed is the master seed)."""


def _report(results: list[FaultResult], lines: list[str], title: str) -> str:
    table = io.StringIO()
    print_table(results, title=title, file=table)
    return "\n".join([*lines, table.getvalue()])


def test_the_subset_covers_every_fault_and_every_backend_point():
    plans = [plan_run(seed, TXIDS, FAULTS) for seed in run_seeds(SEED, RUNS)]
    faults = [f for plan in plans for f in plan.faults]
    assert {f.kind for f in faults} == {KILL, RESTART_LOG, KILL_BACKEND}, plans
    assert {f.point for f in faults if f.kind == KILL_BACKEND} == set(BACKEND_POINTS), plans
    assert {plan.jobs for plan in plans} == {1, 2}, plans


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
    # A fault due after the run's work was done (a fast moment of the machine: every txid of a
    # three-txid run committed within its delay) was not injected: that run is run again, as
    # ``--seed <its seed> --runs 1``, until its faults land (its checks count each time).
    for i, result in enumerate(results):
        for _ in range(3):
            if not _missed(result):
                break
            [result] = run_suite(
                1, result.seed, txids=TXIDS, spark_url=connect_server.url, progress=lines.append
            )
            report = _report([result], lines, f"seed {result.seed} again: a fault missed")
            print(report)
            assert result.recovered and not result.records_lost + result.records_doubled, report
        results[i] = result
    assert not any(_missed(r) for r in results), report


def _missed(result: FaultResult) -> bool:
    events: list[str] = result.extra["events"]  # type: ignore[assignment]
    return any(name.endswith("not injected") for name in events)


def test_the_lake_subset_covers_the_lake_faults():
    plans = {
        sink: plan_run(seed, LAKE_TXIDS, SINK_FAULTS, sink=sink)
        for sink, seed in LAKE_SEEDS.items()
    }
    assert {f.kind for f in plans["delta"].faults} == {FAIL_SINK, KILL_BACKEND}, plans
    assert {f.kind for f in plans["iceberg"].faults} == {FAIL_SINK, KILL_COMMITTER}, plans
    assert all(plan.opaque and plan.tables == 2 for plan in plans.values()), plans


@pytest.mark.parametrize(
    "sink",
    # CI: the Delta pair; the Iceberg pair in make test-scenarios (make chaos-lake: 20 of each)
    [pytest.param(s, marks=[pytest.mark.scenario] if s == "iceberg" else []) for s in LAKE_SEEDS],
)
def test_a_lake_run_recovers_with_nothing_lost_or_doubled_in_the_table(sink, connect_server):
    seed = LAKE_SEEDS[sink]
    lines: list[str] = []
    results = run_suite(
        1, seed, txids=LAKE_TXIDS, sink=sink, spark_url=connect_server.url, progress=lines.append
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
    assert lake["table_txid"] >= LAKE_TXIDS and lake["rows"] > 0, report  # type: ignore[operator]
    second = lake["table words_b"]
    assert isinstance(second, dict), report
    assert second["lost"] == 0 and second["doubled"] == 0 and second["rows"] == lake["rows"], report
    # Every planned fault fired. The failed commit's replay took another batch (the source is
    # opaque and grew) and replaced the first table's rows of the txid. (A killed committer's
    # txid is checked by the lake check: found in the table, or replaced if it failed since.)
    events = result.extra["events"]
    assert isinstance(events, dict), report
    assert not any(name.endswith("not injected") for name in events), report
    assert events.get("commit replaced another attempt's rows in the table", 0) >= 1, report
    assert events.get("replay took another batch (opaque)", 0) >= 1, report
