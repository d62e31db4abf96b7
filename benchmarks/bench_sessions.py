"""What a new Spark Connect server session per txid costs, against attaching to a pipeline's slot.

Run with ``make bench-sessions``. One Postgres, one Spark Connect server (local[2]), one Parquet
dataset (4 partitions, ``--rows`` rows per batch, one file per partition per batch). Two pipelines
read it through the core loop (begin, process with ``SparkConnectRunner``, commit), taking turns
txid by txid so both see the same machine: one with ``reuse_sessions=False`` (a new server
session per txid, as before issue 27), one with the default (the txid attaches to its pipeline's
slot session, ``spark/connect_sessions.py``). After ``--warmup`` txids each, ``--batches`` txids
each are timed. Printed per side: the txid's p50 (begin -> committed), the server JVM's CPU
seconds per txid (the JVM is a child of this process), and the ratio. Both pipelines' states are
checked equal to a plain-Python word count.

Usage: python benchmarks/bench_sessions.py [--rows 100000] [--batches 12] [--warmup 2] [--seed 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from benchmarks.bench_peer import write_dataset  # noqa: E402  (the same data as bench-peer)
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

PARTITIONS = 4
CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=12, help="timed txids per side")
    parser.add_argument("--warmup", type=int, default=2, help="untimed txids per side first")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    total = args.warmup + args.batches
    print(f"bench-sessions: seed {args.seed}, {total} txids of {args.rows} rows per side")
    work = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    truth = write_dataset(work / "data", args.rows, total, args.seed)
    per = args.rows // PARTITIONS
    sides = {"a new server session per txid": False, "the slot's session, reused": True}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
    with (
        EmbeddedPostgres(durable=False) as pg,
        SparkConnectServer(workdir=work / "connect", conf=CONF) as server,
    ):
        txlog = TransactionLog.from_url(pg.url)
        jvm = next(p for p in psutil.Process().children(recursive=True) if p.name() == "java")

        def jvm_cpu() -> float:
            times = jvm.cpu_times()
            return times.user + times.system

        pipelines = {}
        for i, (name, reuse) in enumerate(sides.items()):
            pipeline = f"sessions_{i}"
            source = PartitionedParquetSource(str(work / "data"), max_per_partition=per)
            state = MapState(pipeline, f"{pipeline}_counts", keys={"word": "text"})
            txlog.ensure_pipeline(
                pipeline, source_kind="transactional", max_pending=1, states=[state]
            )
            runner = SparkConnectRunner(
                ROOT / "spark_jobs" / "word_count.py", url=server.url, reuse_sessions=reuse
            )
            pipelines[name] = (pipeline, source, state, runner)
        for n in range(total):
            for name, (pipeline, source, _, runner) in pipelines.items():
                started, used = time.perf_counter(), jvm_cpu()
                emission = txlog.begin_next(pipeline, source)
                assert emission is not None and emission.emitted, emission
                runner.run(BatchJob(pipeline, emission.txid, emission.attempt, source), txlog)
                assert commit_registered(txlog, pipeline, emission.txid, emission.attempt).applied
                if n >= args.warmup:
                    seconds[name].append(time.perf_counter() - started)
                    cpu[name] += jvm_cpu() - used
        for name, (_, _, state, _) in pipelines.items():
            with txlog.engine.connect() as conn:
                got = {key[0]: value for key, value in state.items(conn).items()}
            assert got == dict(truth), f"{name}: the committed counts are wrong"
        txlog.engine.dispose()

    print(f"\n| {args.rows:.0e}-row txids, word count | txid p50 | server JVM CPU-s per txid |")
    print("|---|---|---|")
    for name in sides:
        p50, per_txid = statistics.median(seconds[name]), cpu[name] / args.batches
        print(f"| {name} | {p50:.2f} s | {per_txid:.2f} |")
    new, reused = sides
    print(
        f"\nreused / new: txid p50 "
        f"{statistics.median(seconds[reused]) / statistics.median(seconds[new]):.2f}x, "
        f"JVM CPU {cpu[reused] / cpu[new]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
