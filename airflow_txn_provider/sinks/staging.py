"""The Spark side of a lake sink: a txid's output written by the executors into its attempt's
own staging directory, then listed (names, sizes, footer row counts) for the log.

Only the processing job imports this module (it needs PySpark); the commit does not.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from airflow_txn_provider.sinks.base import LakeSink, StagedFiles, list_staged
from airflow_txn_provider.sinks.schema import check_schema
from airflow_txn_provider.utils.retries import DEFAULT_OUTAGE_TIMEOUT, retrying

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

PARQUET_TIMESTAMPS = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
"""Spark's default INT96 timestamps are refused by Iceberg and deprecated in Delta."""


def stage_frame(
    spark: SparkSession,
    frame: DataFrame,
    sink: LakeSink,
    *,
    pipeline: str,
    txid: int,
    attempt: int,
    log_url: str | None = None,
) -> StagedFiles:
    """Write ``frame`` (with the txid column, if the sink has one) as Parquet into a new run
    directory of ``(txid, attempt)``, and list what was written. If the table exists already,
    its schema is checked here, so a mismatch fails the attempt before anything is recorded."""
    from pyspark.sql import functions as F

    if sink.txid_column:
        frame = frame.withColumn(sink.txid_column, F.lit(txid).cast("long"))
    spark.conf.set(*PARQUET_TIMESTAMPS)
    directory = sink.stage_dir(pipeline, txid, attempt, uuid.uuid4().hex[:12])
    frame.write.mode("error").parquet(directory)
    staged = list_staged(directory)
    schema = staged.arrow_schema()
    if schema is not None:
        # The catalog may be the log's Postgres: wait out a restart as the log's calls do.
        for retry in retrying(DEFAULT_OUTAGE_TIMEOUT, f"lake sink {sink.name!r}"):
            with retry:
                current = sink.open(log_url).schema()
        if current is not None:
            check_schema(
                current, schema, sink=sink.name, pipeline=pipeline, txid=txid, attempt=attempt
            )
    return staged
