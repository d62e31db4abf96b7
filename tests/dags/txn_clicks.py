"""The UI-buttons test's pipelines (tests/integration/on_airflow/test_ui_buttons.py): one word
count per name in ``$TXN_CLICKS`` (comma-separated), each over its own Parquet folder
``$TXN_CLICKS_DATA/<name>``, with a job that takes ``$TXN_CLICKS_JOB_SECONDS`` (a click lands
mid-job) and a 15 s lease, as a person tries every button on a running pipeline."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("TXN_CLICKS_DATA", "/nonexistent"))
BATCH = 20  # lines per txid

for name in filter(None, os.environ.get("TXN_CLICKS", "").split(",")):
    build_dag(
        TxnPipeline(
            name=name,
            source=PartitionedParquetSource(str(DATA / name), max_per_partition=BATCH),
            jobs=[str(ROOT / "tests" / "spark_jobs" / "slow_word_count.py")],
            states=[MapState(name, f"{name}_counts", "transactional", keys={"word": "text"})],
            spark="connect",
            max_pending=3,
            max_attempts=3,
            poll_interval=0.5,
            lease_timeout=15.0,
        )
    )
