"""A batch's rows as they are, with one derived column: ``(p, offset, line, chars)``.

The shape of an ingest into a lake table: one output row per input row, no shuffle. Its output
goes to a lake sink (``BatchJob(..., sinks=(DeltaSink(...),))``), not to a state; ``make
bench-lake`` uses it. Run by ``spark-submit`` (see ``main``) or, on the Spark Connect fast path,
imported for :func:`transform` alone.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from airflow_txn_provider import run_job


def transform(batch: DataFrame) -> DataFrame:
    """Each record's partition, offset and line, and the line's length in characters."""
    return batch.select("p", "offset", "line", F.length("line").alias("chars"))


def main(argv: list[str] | None = None) -> int:
    return run_job(argv, transform)


if __name__ == "__main__":
    sys.exit(main())
