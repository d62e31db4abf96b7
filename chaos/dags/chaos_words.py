"""Word-count pipelines for the chaos suite on Airflow: one DAG per planned run.

``TXN_CHAOS_RUNS`` holds a JSON list of ``{"name", "data", "batch"}``: each run gets its own
pipeline, data and state, so the runs of one Airflow deployment are independent. A run with a
lake sink (``chaos/on_airflow.py --sink delta|iceberg``) also has ``"sink"`` (a
``LakeSink.to_spec()``) and ``"job"`` (a job file whose transform returns the word count for the
state and the sink); without them a run is as it always was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sinks import sink_from_spec
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "word_count.py"

for run in json.loads(os.environ.get("TXN_CHAOS_RUNS", "[]")):
    name = run["name"]
    txn_pipeline = TxnPipeline(
        name=name,
        source=PartitionedParquetSource(run["data"], max_per_partition=int(run["batch"])),
        jobs=[run.get("job", str(JOB))],
        states=[MapState(name, f"{name}_counts", "transactional", keys={"word": "text"})],
        sinks=[sink_from_spec(run["sink"])] if "sink" in run else [],
        max_pending=4,
        max_attempts=3,
        poll_interval=0.5,
        lease_timeout=float(run.get("lease_timeout", 30.0)),
    )
    globals()[name] = build_dag(txn_pipeline, tags=["chaos"])
