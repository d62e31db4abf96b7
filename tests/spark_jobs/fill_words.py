"""The fill test's job (tests/dags/txn_fill.py): word counts, and once the output is added (the
file ``$TXN_FILL_ADDED`` exists, as for the DAG file) line lengths too. Words are split on single
spaces, as the test's truth splits them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job

PIPELINE = "fill_words"


def transform(batch: DataFrame) -> dict[str, DataFrame]:
    words = batch.select(F.explode(F.split("line", " ")).alias("word")).where("word != ''")
    results = {f"{PIPELINE}_counts": words.groupBy("word").agg(F.count("*").alias("delta"))}
    if Path(os.environ.get("TXN_FILL_ADDED", "/nonexistent")).exists():
        results[f"{PIPELINE}_lengths"] = batch.groupBy(
            F.length("line").cast("long").alias("n")
        ).agg(F.count("*").alias("delta"))
    return results


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
