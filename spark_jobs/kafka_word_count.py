"""Word count over a Kafka topic's records: each record's value is a line of text.

The same transform as ``word_count.py``, on the ``value`` column that both Kafka readers give
(``airflow_txn_provider/sources/kafka_read.py``). Run by ``spark-submit`` (see ``main``) or, on the
Spark Connect fast path, imported for :func:`transform` alone.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job

WORD_SPLIT = r"[^\p{L}\p{N}']+"  # as word_count.py's (a job file imports no other job file)


def transform(batch: DataFrame) -> DataFrame:
    """``(word, delta)`` of the batch's record values, read as UTF-8 text."""
    line = F.lower(F.col("value").cast("string"))
    words = batch.select(F.explode(F.split(line, WORD_SPLIT)).alias("word"))
    return words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("delta"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
