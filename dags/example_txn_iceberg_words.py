"""Words merged into an Apache Iceberg table: per word, its count in the newest txid it appeared in.

Files land in a folder (a simulated producer, as in :mod:`example_txn_opaque_words`); each txid
counts its batch's words with Spark, whose executors write the rows (``word``, ``delta``,
``txid``) as Parquet into the txid's staging folder. The commit merges them into the Iceberg
table ``txn_examples.word_latest`` by ``word`` (``pyiceberg``'s upsert: a word's row is replaced,
new words are inserted) in one Iceberg transaction that also records the txid (table property
``txn.example_txn_iceberg_words.txid``, and ``txn.txid`` in the snapshot's summary). The
catalog is pyiceberg's SQL catalog in the transaction log's own Postgres database.

Exactly once, in txid order: a commit retried after a crash finds its txid in the table's
properties and merges nothing twice. Read the table as of txid N with
``IcebergSink(...).read_as_of(pipeline, N, log_url=...)``, or any Iceberg reader
(``snapshot_id`` from the Transactions page's sink version).
"""

from __future__ import annotations

from airflow_txn_provider import IcebergSink, TxnPipeline, build_dag
from txn_examples import SimulatedLandingSource, examples_data_dir, spark_job

NAME = "example_txn_iceberg_words"
SINK = IcebergSink(
    "word_latest",
    table="txn_examples.word_latest",
    warehouse=str(examples_data_dir() / "iceberg"),
    mode="merge",
    keys=["word"],
    txid_column="txid",
)

txn_pipeline = TxnPipeline(
    name=NAME,
    source=SimulatedLandingSource(
        str(examples_data_dir() / "iceberg_landing"),
        max_files_per_partition=4,
        partitions=2,
        files_per_minute=30,
    ),
    jobs=[spark_job(__file__, "word_count.py")],
    states=[],
    sinks=[SINK],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example", "lake"])
