"""Airflow benchmark: commit gap and max_pending speedup on a real Airflow.

Run with ``make bench-airflow``. Starts its own Postgres (Airflow metadata + transaction log),
Spark Connect server (local[2]) and Airflow (scheduler with LocalExecutor, dag-processor,
triggerer, api-server), all on 127.0.0.1, and runs the same compute-bound word count
(``benchmarks/jobs/heavy_words.py``) twice over the same data:

1. with ``max_pending=4`` over ``--txids`` txids: the **commit gap**, end of commit k to end of
   commit k+1 for every k whose successor was already processed when k committed (an upper bound
   of end-of-commit-k to start-of-commit-k+1: it includes commit k+1 itself), p50 and p95;
2. throughput (txids/s from the first begin to the last commit) with ``max_pending=4`` and with
   ``max_pending=1``, and their ratio, against the goal 0.8 x min(4, cores Spark has).

Usage: python benchmarks/bench_airflow.py [--txids 20] [--batch 5000] [--rounds 3000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from airflow_txn_provider.testing.airflow import AirflowStack
from airflow_txn_provider.testing.postgres import EmbeddedPostgres
from airflow_txn_provider.testing.spark import SparkConnectServer
from airflow_txn_provider.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.spark_data import parquet_dataset, random_lines  # noqa: E402

SPARK_CORES = 2  # the Connect server runs local[2]


def _conn(pg: EmbeddedPostgres, database: str) -> str:
    return json.dumps(
        {
            "conn_type": "txn_log",
            "host": "127.0.0.1",
            "port": pg.port,
            "login": "postgres",
            "schema": database,
        }
    )


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
        "AIRFLOW_CONN_TXN_LOG_DEFAULT": _conn(pg, f"log_{name}"),
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
        log = None
        while time.monotonic() < deadline:
            time.sleep(2)
            try:
                log = log or TransactionLog.from_url(log_url, migrate=False)
                done = log.last_committed(name)
            except Exception:  # the pipeline registers itself with its first begin
                continue
            print(f"  {name}: {done}/{args.txids} committed", end="\r", flush=True)
            if done >= args.txids:
                break
        else:
            raise TimeoutError(f"{name}: not every txid committed\n{stack.tail()}")
        api.pause(name)
        assert log is not None
        infos = log.transactions(name)[: args.txids]
        log.engine.dispose()
    print()
    return infos


def seconds(delta) -> float:
    return delta.total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txids", type=int, default=20)
    parser.add_argument("--batch", type=int, default=5000, help="records per txid")
    parser.add_argument("--rounds", type=int, default=3000, help="SHA-256 rounds per record")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-airflow-"))
    workdir.chmod(0o755)
    data = parquet_dataset(workdir / "data", {"0": random_lines(7, args.txids * args.batch)})

    with EmbeddedPostgres(durable=False) as pg, SparkConnectServer(workdir=workdir / "c") as sc:
        runs = {}
        for name, max_pending in (("bench_p4", 4), ("bench_p1", 1)):
            print(f"running {args.txids} txids with max_pending={max_pending} ...", flush=True)
            runs[max_pending] = run_pipeline(pg, sc, workdir, data, args, name, max_pending)

    four = runs[4]
    gaps = [
        seconds(b.committed_at - a.committed_at)
        for a, b in itertools.pairwise(four)
        if b.processed_at is not None and b.processed_at <= a.committed_at
    ]
    throughput = {}
    for max_pending, infos in runs.items():
        span = seconds(infos[-1].committed_at - min(i.begun_at for i in infos))
        throughput[max_pending] = len(infos) / span
    print(f"\nAirflow benchmark: {args.txids} txids x {args.batch} records, {args.rounds} rounds")
    if gaps:
        q = statistics.quantiles(gaps, n=20, method="inclusive")
        print(
            f"commit gap (successor already processed), {len(gaps)} pairs: "
            f"p50 {statistics.median(gaps) * 1000:.0f} ms, p95 {q[18] * 1000:.0f} ms "
            f"(goal p50 < 1000 ms)"
        )
    else:
        print("commit gap: no txid was processed before its predecessor committed")
    ratio = throughput[4] / throughput[1]
    goal = 0.8 * min(4, SPARK_CORES)
    print(
        f"throughput: max_pending=4 {throughput[4]:.3f} txids/s, max_pending=1 "
        f"{throughput[1]:.3f} txids/s, speedup {ratio:.2f}x (goal >= {goal:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
