"""Word count over a partitioned Parquet dataset: the DAG the dag.test and end-to-end tests run.

Configured by environment variables so one file serves every test (each with its own data,
pipeline name and window).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sinks import IcebergSink
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState

ROOT = Path(__file__).resolve().parents[2]
NAME = os.environ.get("TXN_TEST_PIPELINE", "txn_words")

# An Iceberg sink instead of the state when its catalog connection is named (the credentials test)
CATALOG_CONN = os.environ.get("TXN_TEST_ICEBERG_CONN")
SINKS = (
    [
        IcebergSink(
            "words_lake",
            table="txn_test.words",
            warehouse=os.environ["TXN_TEST_ICEBERG_WAREHOUSE"],
            catalog_conn_id=CATALOG_CONN,
        )
    ]
    if CATALOG_CONN
    else []
)

# Alerts by mail when an SMTP connection is named (the credentials test: its poison batch and the
# stall behind it)
ALERT_SMTP_CONN = os.environ.get("TXN_TEST_ALERT_SMTP_CONN")
ALERTS = []
if ALERT_SMTP_CONN:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    ALERTS = [
        SmtpNotifier(
            to="oncall@example.org",
            from_email="airflow@example.org",
            smtp_conn_id=ALERT_SMTP_CONN,
            subject="{{ txn_alert.subject }}",
            html_content="{{ txn_alert.message }}",
        )
    ]

# Expectations when asked (the audit scenario): the words "dog" and "man" are quarantined, and a
# word named in the banned file (if it exists) stops the txid whose batch has it
EXPECTATIONS = []
BANNED_FILE = os.environ.get("TXN_TEST_BANNED_FILE")
if BANNED_FILE:
    from airflow_txn_provider import Check, RowCondition

    def no_banned_word(rows):
        banned = Path(BANNED_FILE).read_text().strip() if Path(BANNED_FILE).exists() else None
        found = [r["word"] for r in rows if r["word"] == banned]
        return not found, f"banned word {banned!r} found {len(found)} time(s)"

    counts = f"{NAME}_counts"
    EXPECTATIONS = [
        RowCondition(on=counts, condition="word NOT IN ('dog', 'man')", action="drop", name="pets"),
        Check(on=counts, fn=no_banned_word, action="fail", name="no banned word"),
    ]

txn_pipeline = TxnPipeline(
    name=NAME,
    source=PartitionedParquetSource(
        os.environ.get("TXN_TEST_DATA", "/nonexistent"),
        max_per_partition=int(os.environ.get("TXN_TEST_BATCH", "50")),
    ),
    jobs=[os.environ.get("TXN_TEST_JOB", str(ROOT / "spark_jobs" / "word_count.py"))],
    states=[]
    if SINKS
    else [MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"})],
    sinks=SINKS,
    spark=os.environ.get("TXN_TEST_SPARK", "connect"),
    max_pending=int(os.environ.get("TXN_TEST_MAX_PENDING", "4")),
    max_attempts=int(os.environ.get("TXN_TEST_MAX_ATTEMPTS", "2")),
    poll_interval=float(os.environ.get("TXN_TEST_POLL", "0.5")),
    lease_timeout=float(os.environ.get("TXN_TEST_LEASE_TIMEOUT", "30")),
    keep_txids=int(os.environ.get("TXN_TEST_KEEP_TXIDS", "1000")),
    alert_notifiers=ALERTS,
    stall_alert_after=float(os.environ.get("TXN_TEST_STALL_ALERT_AFTER", "600")),
    expectations=EXPECTATIONS,
)

dag = build_dag(txn_pipeline)
