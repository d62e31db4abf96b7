"""The word-count pipelines of ``make bench-pipelines``: each a partitioned Parquet directory
counted into one transactional map state, created paused (the benchmark unpauses them).

Two layouts, as deployments have them: every pipeline in this one file, one per entry of
``BENCH_PIPELINES`` (a JSON list of ``{"name", "data"}``: dynamic DAGs, ``--one-file``), or a
file per pipeline that calls :func:`word_count_dag` (copies of one pipeline, the default)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "word_count.py"


def word_count_dag(name: str, data: str) -> Any:
    txn_pipeline = TxnPipeline(
        name=name,
        source=PartitionedParquetSource(
            data, max_per_partition=100_000, schema="offset BIGINT, line STRING"
        ),
        jobs=[JOB],
        states=[MapState(name, f"{name}_counts", keys={"word": "text"})],
        max_pending=int(os.environ.get("BENCH_PIPELINES_MAX_PENDING", "4")),
    )
    return build_dag(txn_pipeline, is_paused_upon_creation=True)


for spec in json.loads(os.environ.get("BENCH_PIPELINES", "[]")):
    globals()[spec["name"]] = word_count_dag(spec["name"], spec["data"])
