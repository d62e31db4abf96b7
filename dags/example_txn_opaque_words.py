"""Opaque source and opaque state: a partition lost during a replay, results still exact.

Storm's opaque transactional spout. The source is a landing folder with one sub-folder per
partition of numbered JSON-lines files
(:class:`~airflow_txn_provider.sources.landing.LandingDirectorySource`); here a simulated
producer lands files as batches are chosen
(:class:`~airflow_txn_provider.sources.simulated_landing.SimulatedLandingSource`, 3 partitions, 30
files a minute each, in ``opaque_landing`` under ``$TXN_EXAMPLES_DATA``, by default
``$AIRFLOW_HOME/txn_examples``).

A partition that is unavailable when a txid is re-emitted is left out of the replay and read by a
later txid, so a replay of a txid can be a *different* batch. Word counts use an opaque state
(``value`` and ``prev_value`` per word, Trident's OpaqueMap): a txid that had already been applied
to a word is re-applied on top of ``prev_value``, so every line still counts exactly once.

**Try it.** Set the Variable ``txn_inject_failure__example_txn_opaque_words`` to the next txid with
a delay (e.g. ``8@20``), and while txid 8 is processing take a partition offline::

    python <dags folder>/txn_examples.py offline <examples data>/opaque_landing p1

Txid 8's replay reads p0 and p2 only (compare its attempts' metadata on the Transactions page).
Bring p1 back (``… online …``): a later txid reads the files it missed, and the committed counts
equal a count of every landed line.
"""

from __future__ import annotations

from airflow_txn_provider import MapState, TxnPipeline, build_dag
from txn_examples import SimulatedLandingSource, examples_data_dir, spark_job

NAME = "example_txn_opaque_words"

txn_pipeline = TxnPipeline(
    name=NAME,
    source=SimulatedLandingSource(
        str(examples_data_dir() / "opaque_landing"),
        max_files_per_partition=4,
        partitions=3,
        files_per_minute=30,
    ),
    jobs=[spark_job(__file__, "word_count.py")],
    states=[MapState(NAME, f"{NAME}_counts", "opaque", keys={"word": "text"})],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example"])
