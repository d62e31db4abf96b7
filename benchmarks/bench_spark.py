"""Spark benchmark: per-txid overhead of the three ways to run a job, and processing throughput.

Run with ``make bench-spark``. Starts its own Postgres, Spark Connect server (local[2]) and Spark
standalone master + worker (2 cores), all on 127.0.0.1, and prints:

1. per-txid wall time of the same small batch (word count of ``--small`` records) through
   ``spark-submit`` on local[2], the Spark Connect fast path, and ``spark-submit`` to the standalone
   master: median and min/max of ``--repeat`` txids each (begin → processed, staged in Postgres).
   The compute itself is the median time of the same batch on an already open Connect session;
   overhead = median wall time - compute;
2. records/s of the processing job (word count, Connect path) on one batch of ``--records`` records.

Usage: python benchmarks/bench_spark.py [--small 1000] [--repeat 5] [--records 10000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from airflow_txn_provider.operators.spark_runner import (
    SparkConnectRunner,
    SparkSubmitRunner,
    load_job_module,
)
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import (  # noqa: E402
    LOOPBACK,
    SparkConnectServer,
    StandaloneCluster,
    keep_classic_mode,
)

WORD_COUNT = ROOT / "spark_jobs" / "word_count.py"
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
PARTITIONS = 4


def generate(spark_url: str, path: Path, records: int) -> None:
    """``records`` lines of 6 words over PARTITIONS partitions, dense offsets per partition."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    with keep_classic_mode():
        spark = SparkSession.builder.remote(spark_url).create()
        try:
            ids = spark.range(records)
            words = [
                F.concat(F.lit("w"), ((F.col("id") * k + k * k) % 997).cast("string"))
                for k in range(1, 7)
            ]
            frame = ids.select(
                (F.col("id") % PARTITIONS).cast("string").alias("p"),
                (F.col("id") / PARTITIONS).cast("long").alias("offset"),
                F.concat_ws(" ", *words).alias("line"),
            )
            (
                frame.repartition(PARTITIONS, "p")
                .sortWithinPartitions("offset")
                .write.mode("overwrite")
                .partitionBy("p")
                .parquet(str(path))
            )
        finally:
            spark.stop()


class Pipeline:
    """One pipeline over a dataset: begin the next txid, process it with ``run``, commit it."""

    def __init__(self, txlog: TransactionLog, name: str, source: PartitionedParquetSource) -> None:
        self.log, self.name, self.source = txlog, name, source
        txlog.register_pipeline(name, source_kind="transactional", max_pending=1)
        MapState(name, f"{name}_words", "transactional", keys={"word": "text"}).create(txlog.engine)

    def txid(self, run: Callable[[BatchJob], object]) -> float:
        emission = self.log.begin_next(self.name, self.source)
        assert emission is not None and emission.emitted, "dataset exhausted"
        job = BatchJob(self.name, emission.txid, emission.attempt, self.source)
        start = time.perf_counter()
        run(job)
        elapsed = time.perf_counter() - start
        info = self.log.transaction(self.name, emission.txid)
        assert info is not None and info.status.value == "processed", info
        commit_registered(self.log, self.name, emission.txid, emission.attempt)
        return elapsed


def summary(samples: list[float]) -> str:
    return (
        f"{statistics.median(samples):6.2f} s  (min {min(samples):.2f}, max {max(samples):.2f}, "
        f"n={len(samples)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000, help="records of the small batch")
    parser.add_argument("--repeat", type=int, default=5, help="txids per submission path")
    parser.add_argument("--records", type=int, default=10_000_000, help="records, throughput run")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="txn-bench-spark-"))
    work.chmod(0o755)
    print(f"bench-spark: work folder {work}", flush=True)
    with (
        EmbeddedPostgres(durable=True) as pg,
        SparkConnectServer(workdir=work / "connect") as connect,
        StandaloneCluster(worker_cores=2, worker_memory="2g", workdir=work / "standalone") as sa,
    ):
        txlog = TransactionLog.from_url(pg.url)
        per_partition = max(1, args.small // PARTITIONS)
        small_path = work / "small"
        big_path = work / "big"
        t0 = time.perf_counter()
        small_records = per_partition * PARTITIONS * (4 * args.repeat + 2)
        generate(connect.url, small_path, small_records)
        generate(connect.url, big_path, args.records)
        print(f"generated datasets in {time.perf_counter() - t0:.1f} s", flush=True)

        def small_source() -> PartitionedParquetSource:
            return PartitionedParquetSource(str(small_path), max_per_partition=per_partition)

        submit_local = SparkSubmitRunner(
            WORD_COUNT,
            log_url=pg.url,
            conn_id="bench_local",
            conf=CONF,
        )
        submit_cluster = SparkSubmitRunner(
            WORD_COUNT, log_url=pg.url, conn_id="bench_cluster", conf={**CONF}
        )
        os.environ["AIRFLOW_CONN_BENCH_LOCAL"] = "spark://local%5B2%5D?deploy-mode=client"
        os.environ["AIRFLOW_CONN_BENCH_CLUSTER"] = json.dumps(
            {"conn_type": "spark", "host": sa.master_url, "extra": {"deploy-mode": "client"}}
        )
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        connect_runner = SparkConnectRunner(WORD_COUNT, url=connect.url)

        results: dict[str, list[float]] = {}
        paths: list[tuple[str, Callable[[BatchJob], object]]] = [
            ("spark-submit local[2]", submit_local.run),
            ("Spark Connect", lambda job: connect_runner.run(job, txlog)),
            ("spark-submit standalone", submit_cluster.run),
        ]
        for name, run in paths:
            pipeline = Pipeline(txlog, f"small_{len(results)}", small_source())
            samples = [pipeline.txid(run) for _ in range(args.repeat)]
            results[name] = samples
            print(f"{name:<26} {summary(samples)}", flush=True)

        # Compute alone: the same batch size on a session that is already open.
        transform = load_job_module(WORD_COUNT).transform
        from pyspark.sql import SparkSession

        with keep_classic_mode():
            session = SparkSession.builder.remote(connect.url).create()
            try:
                pipeline = Pipeline(txlog, "small_warm", small_source())

                def warm(job: BatchJob) -> object:
                    return process_batch(session, txlog, job, transform)

                pipeline.txid(warm)  # warm-up txid, not counted
                compute = [pipeline.txid(warm) for _ in range(args.repeat)]
            finally:
                session.stop()
        compute_median = statistics.median(compute)

        # Throughput: one batch with every record.
        big = Pipeline(
            txlog,
            "big",
            PartitionedParquetSource(str(big_path), max_per_partition=args.records),
        )
        big_seconds = big.txid(lambda job: connect_runner.run(job, txlog))

    print()
    print(
        f"Per-txid time, word count of a {per_partition * PARTITIONS}-record batch "
        f"(begin -> processed, staged in Postgres):"
    )
    print(f"| path | median per txid | overhead beyond compute ({compute_median:.2f} s) |")
    print("|---|---|---|")
    for name, samples in results.items():
        med = statistics.median(samples)
        print(
            f"| {name} | {med:.2f} s (min {min(samples):.2f}, max {max(samples):.2f}) | "
            f"{med - compute_median:.2f} s |"
        )
    print(f"| compute on an open Connect session | {compute_median:.2f} s | - |")
    print()
    print(
        f"Processing throughput (word count, Spark Connect, local[2]): {args.records:,} records "
        f"in {big_seconds:.1f} s = {args.records / big_seconds:,.0f} records/s"
    )
    goal = statistics.median(results["Spark Connect"]) - compute_median
    print(
        f"Goal: Spark Connect overhead <= 1.5 s per txid: {goal:.2f} s "
        f"({'met' if goal <= 1.5 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
