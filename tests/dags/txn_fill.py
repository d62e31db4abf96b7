"""The fill test's pipeline (tests/integration/on_airflow/test_fill_airflow.py): ``fill_words``
counts words (its first txids were committed with the core API before the deployment started). Once
the file ``$TXN_FILL_ADDED`` exists (the test creates it: a person editing the DAG file), the next
parse adds ``fill_words_lengths`` with ``start="history"``, so ``build_dag`` also builds
``fill_words__fill``, which fills it from the committed txids."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

ROOT = Path(__file__).resolve().parents[2]
NAME = "fill_words"
BATCH = 10  # lines per partition per txid

counts = MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"})
lengths = MapState(NAME, f"{NAME}_lengths", "opaque", keys={"n": "bigint"})
ADDED = Path(os.environ.get("TXN_FILL_ADDED", "/nonexistent")).exists()

txn_pipeline = TxnPipeline(
    name=NAME,
    source=PartitionedParquetSource(os.environ.get("TXN_FILL_DATA", "/nonexistent"), BATCH),
    jobs=[str(ROOT / "tests" / "spark_jobs" / "fill_words.py")],
    states=[counts, lengths] if ADDED else [counts],
    start={lengths.name: "history"} if ADDED else {},
    spark="connect",
    max_pending=2,
    poll_interval=0.5,
    fill_chunk=1,  # one txid per step: the test sees the page while it fills
)

dag = build_dag(txn_pipeline)
