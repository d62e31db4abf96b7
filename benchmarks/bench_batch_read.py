"""Where the Spark time of one batch goes: this project's batch read vs plainer reads of the same
files, on one warm Spark Connect session (local[2]), the same word count, collected as Arrow.

Run with ``make bench-read``. One Parquet dataset of 4 partitions, ``--batches`` batches of
``--rows`` rows (one file per partition per batch). For every batch, each variant reads it and
runs ``spark_jobs/word_count.py``'s transform; printed: the median seconds per batch (after a
warm-up round) and each variant's ratio to one plain scan of the batch's files, which is what
Structured Streaming's file source does:

* ``one scan of the batch's files``: ``spark.read.parquet(*files)``;
* ``+ offset filter``: the same, with the batch's offset range pushed down;
* ``one scan per partition, unioned``: a scan per partition directory's file, no filter;
* ``this project, before: a scan per partition``: the read this project used until it scanned
  once (``PartitionedParquetSource._read_by_partition``): a scan per partition of the files
  holding its offsets, the offset filter, the partition labelled, unioned;
* ``this project: escaped names (per partition), + completeness check, observed``: what the
  job runs on Spark Connect for partition names Spark would decode (``%`` escapes, empty or
  Hive-null names, ``k=v`` sub-folders), which ``read_batch`` reads per partition
  (``_read_by_partition``), the completeness counts observed; here the names are plain and the
  one scan is refused, so the same files are read both ways;
* ``this project: read_batch``: ``PartitionedParquetSource.read_batch``: the same scan, with
  each row's partition from its directory (Spark attaches it per file), as a string;
* ``this project: + completeness check, observed``: what the job runs on Spark Connect;
* ``this project: + completeness check, own pass``: what it runs on a classic session.

Usage: python benchmarks/bench_batch_read.py [--rows 1000000] [--batches 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_txn_provider.sources.parquet import PartitionedParquetSource

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from spark_jobs.word_count import transform  # noqa: E402
from txn_testing.spark import SparkConnectServer, keep_classic_mode  # noqa: E402

PARTITIONS = 4
SCHEMA = "offset BIGINT, line STRING"
"""The files' columns, as a user declares them (``PartitionedParquetSource(schema=)``)."""
SEED = 7


def write(root: Path, rows: int, batches: int, seed: int) -> None:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(1000)]
    per = rows // PARTITIONS
    for b in range(batches):
        for p in range(PARTITIONS):
            directory = root / f"p={p}"
            directory.mkdir(parents=True, exist_ok=True)
            offsets = pa.array(range(b * per, (b + 1) * per), pa.int64())
            words = pa.array(rng.choices(vocabulary, k=per))
            pq.write_table(
                pa.table({"offset": offsets, "line": words}), directory / f"part-{b:05d}.parquet"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    print(f"bench-read: seed {args.seed}, {args.batches} batches of {args.rows} rows")
    root = Path(tempfile.mkdtemp(prefix="bench-read-"))
    write(root, args.rows, args.batches, args.seed)
    per = args.rows // PARTITIONS
    source = PartitionedParquetSource(str(root), max_per_partition=per)
    declared = PartitionedParquetSource(str(root), max_per_partition=per, schema=SCHEMA)

    from pyspark.sql import DataFrame, Observation, SparkSession
    from pyspark.sql import functions as F

    def files(b: int) -> list[str]:
        return [str(root / f"p={p}" / f"part-{b:05d}.parquet") for p in range(PARTITIONS)]

    def metadata(b: int) -> dict[str, list[int]]:
        return {str(p): [b * per, (b + 1) * per] for p in range(PARTITIONS)}

    with SparkConnectServer(conf={"spark.sql.shuffle.partitions": "4"}) as server:
        with keep_classic_mode():
            spark = SparkSession.builder.remote(server.url).create()
            offset = F.col("offset")

            def in_batch(b: int) -> Any:
                return (offset >= b * per) & (offset < (b + 1) * per)

            def observed(b: int, source: PartitionedParquetSource = source) -> DataFrame:
                counts = source.batch_counts(metadata(b)) or {}
                obs = Observation(f"bench_{b}_{time.monotonic_ns()}")
                batch = source.read_batch(spark, metadata(b))
                return batch.observe(obs, *[c.alias(n) for n, c in counts.items()])

            def by_partition(b: int) -> DataFrame:
                ranges = {p: (a, z) for p, (a, z) in metadata(b).items()}
                held = {p: source._files_holding(str(root), p, *r) for p, r in ranges.items()}
                return source._read_by_partition(spark, held, ranges)

            def escaped_names(b: int) -> DataFrame:
                counts = source.batch_counts(metadata(b)) or {}
                obs = Observation(f"bench_escaped_{b}_{time.monotonic_ns()}")
                with mock.patch(
                    "airflow_txn_provider.sources.parquet.read_with_partition_column",
                    return_value=None,  # as for names Spark would decode: a scan per partition
                ):
                    batch = source.read_batch(spark, metadata(b))
                return batch.observe(obs, *[c.alias(n) for n, c in counts.items()])

            def own_pass(b: int) -> DataFrame:
                batch = source.read_batch(spark, metadata(b))
                assert source.batch_mismatch(batch, metadata(b)) is None
                return batch

            variants: dict[str, Callable[[int], DataFrame]] = {
                "one scan of the batch's files": lambda b: spark.read.parquet(*files(b)),
                "one scan, schema declared (as Structured Streaming's file source)": (
                    lambda b: (
                        spark.read.schema(f"{SCHEMA}, p STRING")
                        .option("basePath", str(root))
                        .parquet(*files(b))
                    )
                ),
                "+ offset filter": lambda b: spark.read.parquet(*files(b)).where(in_batch(b)),
                "one scan per partition, unioned": lambda b: functools.reduce(
                    DataFrame.unionByName, [spark.read.parquet(f) for f in files(b)]
                ),
                "this project, before: a scan per partition": by_partition,
                "this project: escaped names (per partition), + completeness check, observed": (
                    escaped_names
                ),
                "this project: read_batch": lambda b: source.read_batch(spark, metadata(b)),
                "this project: + completeness check, observed": observed,
                "this project: + completeness check, own pass": own_pass,
                "this project: + completeness check, observed, schema declared": (
                    lambda b: observed(b, declared)
                ),
            }
            seconds: dict[str, list[float]] = {name: [] for name in variants}
            for round_ in range(args.rounds + 1):  # round 0 warms the JVM up
                for b in range(args.batches):
                    for name, read in variants.items():
                        started = time.perf_counter()
                        table = transform(source.records(read(b))).toArrow()
                        if round_:
                            seconds[name].append(time.perf_counter() - started)
                        assert table.num_rows > 0
            spark.stop()

    base = statistics.median(seconds["one scan of the batch's files"])
    what = f"read of one {args.rows:.0e}-row batch + word count"
    print(f"\n| {what} | s per batch (p50) | vs one scan |")
    print("|---|---|---|")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
