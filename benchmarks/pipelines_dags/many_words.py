"""The word-count pipelines of ``make bench-pipelines``: one per entry of ``BENCH_PIPELINES`` (a
JSON list of ``{"name", "data"}``), each a partitioned Parquet directory counted into one
transactional map state, created paused (the benchmark unpauses them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.spark.parquet_source import PartitionedParquetSource
from airflow_txn_provider.state import MapState

JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "word_count.py"

for spec in json.loads(os.environ.get("BENCH_PIPELINES", "[]")):
    pipeline = TxnPipeline(
        name=spec["name"],
        source=PartitionedParquetSource(
            spec["data"], max_per_partition=100_000, schema="offset BIGINT, line STRING"
        ),
        jobs=[JOB],
        states=[MapState(spec["name"], f"{spec['name']}_counts", keys={"word": "text"})],
        max_pending=int(os.environ.get("BENCH_PIPELINES_MAX_PENDING", "4")),
    )
    globals()[spec["name"]] = build_dag(pipeline, is_paused_upon_creation=True)
