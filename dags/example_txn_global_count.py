"""Global count: one value, the number of lines ever committed.

Storm's ``TransactionalGlobalCount``, the smallest transactional pipeline: each txid counts the
lines of its batch on Spark and the commit adds that count to a single
:class:`~airflow_txn_provider.state.GlobalState`, in the same Postgres transaction as the txid's
"committed" mark. The state stores the txid that last updated it, so a replayed commit of the
same txid cannot add twice. Lines come from
:class:`~airflow_txn_provider.sources.generated.GeneratedTextSource` (3 partitions x 10
lines a second), so the DAG runs out of the box.

Failure injection: the Airflow Variable ``txn_inject_failure__example_txn_global_count`` (``5``,
``5@10``, ``5:*``; see ``docs/airflow.md``). However often txids replay, the value equals the
number of lines in the committed offset ranges.
"""

from __future__ import annotations

from airflow_txn_provider import GeneratedTextSource, GlobalState, TxnPipeline, build_dag
from txn_examples import spark_job

NAME = "example_txn_global_count"

txn_pipeline = TxnPipeline(
    name=NAME,
    source=GeneratedTextSource(lines_per_second=10, max_per_partition=300, partitions=3, seed=1),
    jobs=[spark_job(__file__, "global_count.py")],  # returns (delta): the batch's line count
    states=[GlobalState(NAME, f"{NAME}_total", "transactional")],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example"])
