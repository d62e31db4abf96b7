"""Word count: the partial result of one batch is ``(word, delta)``, the state sums the deltas.

Storm's TransactionalWords, first half. Run by ``spark-submit`` (see ``main``) or, on the Spark
Connect fast path, imported for :func:`transform` alone.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job

WORD_SPLIT = r"[^\p{L}\p{N}']+"


def words(lines: DataFrame, column: str = "line") -> DataFrame:
    """One row per word of ``column`` (lower-cased), empty words dropped."""
    word = F.explode(F.split(F.lower(F.col(column)), WORD_SPLIT)).alias("word")
    return lines.select(word).where(F.col("word") != "")


def transform(batch: DataFrame) -> DataFrame:
    """``(word, delta)``: how often each word occurs in the batch."""
    return words(batch).groupBy("word").agg(F.count("*").alias("delta"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
