"""Word count that takes ``$TXN_CLICKS_JOB_SECONDS`` seconds more per batch: the job of the
UI-buttons test (tests/integration/on_airflow/test_ui_buttons.py), so that a click lands while it
runs."""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job

WORD_SPLIT = r"[^\p{L}\p{N}']+"


def transform(batch: DataFrame) -> DataFrame:
    time.sleep(float(os.environ.get("TXN_CLICKS_JOB_SECONDS", "12")))
    word = F.explode(F.split(F.lower(F.col("line")), WORD_SPLIT)).alias("word")
    words = batch.select(word).where(F.col("word") != "")
    return words.groupBy("word").agg(F.count("*").alias("delta"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
