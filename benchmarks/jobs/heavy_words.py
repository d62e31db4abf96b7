"""Word count made compute-bound for the Airflow benchmark.

Every line is hashed ``BENCH_HASH_ROUNDS`` times in a chain (SHA-256 in the JVM) before it is
counted, so a batch keeps one core busy for seconds and the max_pending speedup measures parallel
processing, not task overhead."""

from __future__ import annotations

import os
import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job

ROUNDS = int(os.environ.get("BENCH_HASH_ROUNDS", "400"))


def transform(batch: DataFrame) -> DataFrame:
    # a loop per record (higher-order function): CPU grows with ROUNDS, the plan does not
    digest = F.aggregate(
        F.sequence(F.lit(1), F.lit(ROUNDS)),
        F.lit(""),
        lambda acc, _i: F.sha2(F.concat(acc, F.col("line")), 256),
    )
    # One Spark task per batch, as a small batch is: the speedup measured is then parallelism
    # across txids (max_pending), not inside one txid's job.
    hashed = batch.coalesce(1).where(digest != F.lit(""))  # always true; forces the hashing
    word = F.explode(F.split(F.lower(F.col("line")), r"[^\p{L}\p{N}']+")).alias("word")
    return (
        hashed.select(word)
        .where(F.col("word") != "")
        .groupBy("word")
        .agg(F.count("*").alias("delta"))
    )


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
