"""Words into a Delta Lake table: each txid's word counts appended exactly once, in txid order.

The word count of :mod:`example_txn_words`, written by Spark's executors as Parquet and committed
into a Delta table with ``deltalake`` (no JVM on the Airflow side, no Maven):

* ``process_word_count`` processes the txid and writes its rows (``word``, ``delta``, ``txid``)
  into the txid's own staging folder under the table (``txn/<pipeline>/<txid>/``);
* the commit adds exactly those files to the table in one Delta commit that records the app
  transaction ``(example_txn_delta_words, txid)``. A commit retried after a crash finds its txid
  in the table and adds nothing twice; files of failed attempts are deleted.

Every reader of the table (Spark, DuckDB, pandas via ``deltalake``) sees only committed txids.
Read it as it was when txid 12 committed::

    from airflow_txn_provider import DeltaSink
    DeltaSink("word_counts", table_uri="<examples data>/lake/delta_words").read_as_of(
        "example_txn_delta_words", 12)

Each commit updates the Asset ``txn:example_txn_delta_words:word_counts`` with the txid in its
extra: :mod:`example_txn_lake_downstream` runs on it. The **Transactions** page shows the table
version each txid committed as.
"""

from __future__ import annotations

from airflow_txn_provider import DeltaSink, GeneratedTextSource, TxnPipeline, build_dag
from txn_examples import examples_data_dir, spark_job

NAME = "example_txn_delta_words"
SINK = DeltaSink(
    "word_counts", table_uri=str(examples_data_dir() / "lake" / "delta_words"), txid_column="txid"
)

txn_pipeline = TxnPipeline(
    name=NAME,
    source=GeneratedTextSource(lines_per_second=20, max_per_partition=500, partitions=2),
    jobs=[spark_job(__file__, "word_count.py")],  # (word, delta): the sink's rows
    states=[],
    sinks=[SINK],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example", "lake"])
