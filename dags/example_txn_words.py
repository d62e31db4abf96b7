"""Words: counts per word and counts per count-bucket, updated in one transaction.

Storm's ``TransactionalWords``. Each txid reads a batch of generated lines (no data set needed:
:class:`~airflow_txn_provider.sources.generated.GeneratedTextSource` writes 2 x 20 lines a
second, and a replay reads exactly the same lines), Spark counts its words, and the commit applies
two states in one Postgres transaction with the txid's "committed" mark:

* ``example_txn_words_counts``: the count of every word;
* ``example_txn_words_buckets``: how many words have a count in 0-9, 10-19, … A word crossing
  from one bucket to the next leaves the old one in the same commit. This needs the committed
  count before the batch, which only the commit can see (txids process in parallel), so the bucket
  state is derived at commit time (:class:`~airflow_txn_provider.state.BucketCountState`).

**Watch a failure and its replay.** Set the Airflow Variable
``txn_inject_failure__example_txn_words`` to the next txid (e.g. ``12``; ``12@10`` fails it 10 s
into processing, ``12:*`` on every attempt). That txid fails, every later txid in flight fails
with it, and their runs re-begin with new attempts, in txid order. With ``12:*`` the txid becomes
a poison batch after ``max_attempts``: its run gets a note and later txids wait. Delete the
Variable, then press **Clear** on the txid's run in the grid: it and every later txid commit.
The **Transactions** page shows attempts, errors and the two states.
"""

from __future__ import annotations

from airflow_txn_provider import (
    BucketCountState,
    GeneratedTextSource,
    MapState,
    TxnPipeline,
    build_dag,
)
from txn_examples import spark_job

NAME = "example_txn_words"

txn_pipeline = TxnPipeline(
    name=NAME,
    source=GeneratedTextSource(lines_per_second=20, max_per_partition=500, partitions=2),
    jobs=[spark_job(__file__, "word_count.py")],  # returns (word, delta): the counts' batch
    states=[
        MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"}),
        BucketCountState(NAME, f"{NAME}_buckets", of=f"{NAME}_counts", bucket_size=10),
    ],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example"])
