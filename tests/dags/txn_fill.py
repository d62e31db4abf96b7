"""The fill test's pipeline (tests/integration/test_fill_airflow.py): ``fill_words`` counted
words through its first txids before this DAG file existed (the test's fixture committed them
with the core API); this version adds ``fill_words_lengths`` with ``start="history"``, so
``build_dag`` also builds ``fill_words__fill``, which fills it from those txids."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.spark.parquet_source import PartitionedParquetSource
from airflow_txn_provider.state import MapState

ROOT = Path(__file__).resolve().parents[2]
NAME = "fill_words"
BATCH = 10  # lines per partition per txid

counts = MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"})
lengths = MapState(NAME, f"{NAME}_lengths", "opaque", keys={"n": "bigint"})

pipeline = TxnPipeline(
    name=NAME,
    source=PartitionedParquetSource(os.environ.get("TXN_FILL_DATA", "/nonexistent"), BATCH),
    jobs=[str(ROOT / "tests" / "spark_jobs" / "fill_words.py")],
    states=[counts, lengths],
    start={lengths.name: "history"},
    spark="connect",
    max_pending=2,
    poll_interval=0.5,
)

dag = build_dag(pipeline)
