"""Global count: one value, the number of records committed (Storm's TransactionalGlobalCount)."""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job


def transform(batch: DataFrame) -> DataFrame:
    """``(delta)``: the number of records in the batch."""
    return batch.agg(F.count(F.lit(1)).alias("delta"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
