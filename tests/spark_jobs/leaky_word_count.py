"""Word count whose error on a marked batch carries its catalog's URL, password included: the job
a credentials test runs, to see that the password is redacted wherever the error goes."""

from __future__ import annotations

import os
import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job
from airflow_txn_provider.utils.credentials import connection_url

MARK = "leakmarker"
WORD_SPLIT = r"[^\p{L}\p{N}']+"


def transform(batch: DataFrame) -> DataFrame:
    if batch.where(F.col("line").contains(MARK)).limit(1).count():
        url = connection_url(os.environ["TXN_TEST_ICEBERG_CONN"])
        raise RuntimeError(f"the batch holds {MARK}; the catalog at {url} refuses it")
    word = F.explode(F.split(F.lower(F.col("line")), WORD_SPLIT)).alias("word")
    words = batch.select(word).where(F.col("word") != "")
    return words.groupBy("word").agg(F.count("*").alias("delta"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
