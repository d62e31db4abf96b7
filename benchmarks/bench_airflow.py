"""Airflow benchmark: commit gap and max_pending speedup on a real Airflow.

Run with ``make bench-airflow``. Starts its own Postgres (Airflow metadata + transaction log),
Spark Connect server (local[2]) and Airflow (scheduler with LocalExecutor, dag-processor,
triggerer, api-server), all on 127.0.0.1, and runs the same compute-bound word count
(``benchmarks/jobs/heavy_words.py``) twice over the same data:

1. with ``max_pending=4`` over ``--txids`` txids: the **commit gap**, end of commit k to end of
   commit k+1 for every k whose successor was already processed when k committed (an upper bound
   of end-of-commit-k to start-of-commit-k+1: it includes commit k+1 itself), p50 and p95;
2. throughput (txids/s from the first begin to the last commit) with ``max_pending=4`` and with
   ``max_pending=1`` over ``--speedup-txids`` txids, and their ratio, against the goal
   0.8 x min(4, cores Spark has).

The gap run uses light batches (``--rounds``); the speedup runs heavy ones (``--heavy-rounds``,
tens of seconds of one core per txid) so that Airflow's own per-task cost (a Python process per
task, on the same two cores) does not dominate.

Usage: python benchmarks/bench_airflow.py [--txids 20] [--speedup-txids 8] [--batch 5000]
       [--rounds 50] [--heavy-rounds 6000]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.spark_data import parquet_dataset, random_lines  # noqa: E402
from txn_testing.airflow import AirflowStack, txn_log_connection_env  # noqa: E402
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

SPARK_CORES = 2  # the Connect server runs local[2]


def run_pipeline(pg, connect, workdir: Path, data: Path, args, name: str, max_pending: int):
    admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE meta_{name}"))
        conn.execute(text(f"CREATE DATABASE log_{name}"))
    admin.dispose()
    env = {
        "TXN_TEST_PIPELINE": name,
        "TXN_TEST_DATA": str(data),
        "TXN_TEST_BATCH": str(args.batch),
        "TXN_TEST_MAX_PENDING": str(max_pending),
        "TXN_TEST_JOB": str(ROOT / "benchmarks" / "jobs" / "heavy_words.py"),
        "TXN_TEST_POLL": "0.5",
        "BENCH_HASH_ROUNDS": str(args.rounds),
        **txn_log_connection_env(
            "txn_log_default", f"postgresql://postgres@127.0.0.1:{pg.port}/log_{name}"
        ),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect.url,
    }
    meta = f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/meta_{name}"
    stack = AirflowStack(workdir / name, meta, ROOT / "tests" / "dags", env=env)
    with stack:
        api = stack.client()
        api.wait_for_dag(name)
        api.unpause(name)
        log_url = f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/log_{name}"
        deadline = time.monotonic() + 3600
        txlog = None
        while time.monotonic() < deadline:
            time.sleep(2)
            try:
                txlog = txlog or TransactionLog.from_url(log_url, migrate=False)
                done = txlog.last_committed(name)
            except Exception:  # the pipeline registers itself with its first begin
                continue
            print(f"  {name}: {done}/{args.txids} committed", end="\r", flush=True)
            if done >= args.txids:
                break
        else:
            raise TimeoutError(f"{name}: not every txid committed\n{stack.tail()}")
        api.pause(name)
        assert txlog is not None
        infos = txlog.transactions(name)[: args.txids]
        txlog.engine.dispose()
    print()
    return infos


def seconds(delta) -> float:
    return delta.total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txids", type=int, default=20, help="txids of the commit-gap run")
    parser.add_argument("--speedup-txids", type=int, default=8)
    parser.add_argument("--batch", type=int, default=5000, help="records per txid")
    parser.add_argument("--rounds", type=int, default=50, help="SHA-256 rounds, commit-gap run")
    parser.add_argument(
        "--heavy-rounds", type=int, default=6000, help="SHA-256 rounds, speedup runs"
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-airflow-"))
    workdir.chmod(0o755)
    most = max(args.txids, args.speedup_txids)
    data = parquet_dataset(workdir / "data", {"0": random_lines(7, most * args.batch)})

    with EmbeddedPostgres(durable=False) as pg, SparkConnectServer(workdir=workdir / "c") as sc:
        plan = (
            ("gap_p4", 4, args.txids, args.rounds),
            ("heavy_p4", 4, args.speedup_txids, args.heavy_rounds),
            ("heavy_p1", 1, args.speedup_txids, args.heavy_rounds),
        )
        runs = {}
        for name, max_pending, txids, rounds in plan:
            print(f"{name}: {txids} txids, max_pending={max_pending}, {rounds} rounds", flush=True)
            run_args = argparse.Namespace(txids=txids, batch=args.batch, rounds=rounds)
            runs[name] = run_pipeline(pg, sc, workdir, data, run_args, name, max_pending)

    gap_run = runs["gap_p4"]
    gaps = [
        seconds(b.committed_at - a.committed_at)
        for a, b in itertools.pairwise(gap_run)
        if b.processed_at is not None and b.processed_at <= a.committed_at
    ]
    print(f"\nAirflow benchmark ({os.cpu_count()} cores on this machine, Spark local[2])")
    if gaps:
        q = statistics.quantiles(gaps, n=20, method="inclusive")
        print(
            f"commit gap over {len(gap_run)} txids ({len(gaps)} successors already processed): "
            f"p50 {statistics.median(gaps) * 1000:.0f} ms, p95 {q[18] * 1000:.0f} ms "
            "(goal p50 < 1000 ms)"
        )
    else:
        print("commit gap: no txid was processed before its predecessor committed")
    throughput, processing = {}, {}
    for name in ("heavy_p4", "heavy_p1"):
        infos = runs[name]
        span = seconds(infos[-1].committed_at - min(i.begun_at for i in infos))
        throughput[name] = len(infos) / span
        processing[name] = statistics.median(seconds(i.processed_at - i.begun_at) for i in infos)
    ratio = throughput["heavy_p4"] / throughput["heavy_p1"]
    goal = 0.8 * min(4, SPARK_CORES)
    print(
        f"throughput, {args.speedup_txids} txids x {args.batch} records x {args.heavy_rounds} "
        f"rounds: max_pending=4 {throughput['heavy_p4']:.4f} txids/s (median begin->processed "
        f"{processing['heavy_p4']:.1f} s), max_pending=1 {throughput['heavy_p1']:.4f} txids/s "
        f"({processing['heavy_p1']:.1f} s): speedup {ratio:.2f}x (goal >= {goal:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
