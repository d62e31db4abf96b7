"""The word-count pipelines of ``make bench-peer``, one per batch size, declared from the
environment (``BENCH_PEER_PIPELINES``: JSON list of ``{"name", "data", "per_partition",
"schema"}``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "word_count.py"

for spec in json.loads(os.environ.get("BENCH_PEER_PIPELINES", "[]")):
    txn_pipeline = TxnPipeline(
        name=spec["name"],
        source=PartitionedParquetSource(
            spec["data"], max_per_partition=spec["per_partition"], schema=spec.get("schema")
        ),
        jobs=[JOB],
        states=[MapState(spec["name"], f"{spec['name']}_counts", keys={"word": "text"})],
        # unset: the default, a window that fits the Spark (--max-pending N: that window)
        max_pending=int(os.environ.get("BENCH_PEER_MAX_PENDING") or 0) or None,
    )
    globals()[spec["name"]] = build_dag(
        txn_pipeline, triggerer_start=os.environ.get("BENCH_PEER_TRIGGERER_START", "1") == "1"
    )
