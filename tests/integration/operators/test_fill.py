"""The fill DAG's task (operators/fill.py) on a real classic session and a real Spark Connect
server: its Connect session opens in a process that runs a classic one, and leaves no mark."""

from __future__ import annotations

import os

from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import CONNECT_MODE_ENV
from airflow_txn_provider.state import MapState

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
WORD_COUNT = os.path.join(ROOT, "spark_jobs", "word_count.py")


def test_the_fill_operators_connect_session_opens_beside_a_classic_one(
    spark, connect_server, monkeypatch
):
    """A warmed task process that once ran a classic driver (a fill of a ``spark="submit"``
    pipeline runs it in the task's process) still opens the fill's Spark Connect session:
    ``getOrCreate()`` refused it with ``SESSION_ALREADY_EXIST`` while a classic one runs."""
    from airflow_txn_provider.operators.fill import TxnFillOperator
    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.spark.connect_sessions import keep_classic_mode

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_server.url)
    txn_pipeline = TxnPipeline(
        name="marks",
        source=PartitionedParquetSource("/data/none"),
        jobs=[WORD_COUNT],
        states=[MapState("marks", "marks_counts", keys={"word": "text"})],
        spark="connect",
    )
    operator = TxnFillOperator(task_id="fill", txn_pipeline=txn_pipeline)
    assert spark.range(3).count() == 3  # the classic session runs
    with keep_classic_mode():  # as execute holds it around the fill
        session = operator._open_session()
        try:
            assert session.range(5).count() == 5
        finally:
            session.stop()
    assert not [n for n in CONNECT_MODE_ENV if n in os.environ]
    assert spark.range(4).count() == 4
