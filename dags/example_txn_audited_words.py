"""Audited words: word counts published only after each txid's audit (issue 60).

The words example's counts, with expectations checked over each txid's staged rows inside its
commit (one Postgres query per state, in the commit's transaction), before anything is
published:

* **drop** ``stop words``: rows for *the*, *to* and *and* go to the quarantine
  (``txn_quarantine``, stamped with pipeline, txid and attempt); the rest commits;
* **warn** ``frequent word``: a word counted 500 times or more in one batch is recorded and
  shown, and commits;
* **warn** ``batch size``: a batch whose number of distinct words is more than 4 standard
  deviations from the last 20 committed txids' is recorded;
* **fail** ``words in every batch``: a txid with no words at all does not commit; the pipeline
  stops at it, a poison batch, with a note naming the expectation.

**Watch a poison batch.** Change ``frequent word``'s action to ``"fail"`` and lower its bound
(``delta < 5``): the next txid stops with a note naming the expectation, its counts and sample
keys; later txids wait. Put the rule back and press **Clear** on the txid's run: it and every
later txid commit. The **Transactions** page shows each txid's outcomes and its quarantined rows.
"""

from __future__ import annotations

from airflow_txn_provider import (
    GeneratedTextSource,
    MapState,
    RowCondition,
    RowCount,
    RowCountWithinSigma,
    TxnPipeline,
    build_dag,
)
from txn_examples import spark_job

NAME = "example_txn_audited_words"
COUNTS = f"{NAME}_counts"
STOP_WORDS = ("the", "to", "and")

txn_pipeline = TxnPipeline(
    name=NAME,
    source=GeneratedTextSource(lines_per_second=20, max_per_partition=500, partitions=2, seed=7),
    jobs=[spark_job(__file__, "word_count.py")],  # returns (word, delta): the counts' batch
    states=[MapState(NAME, COUNTS, "transactional", keys={"word": "text"})],
    expectations=[
        RowCondition(
            on=COUNTS,
            condition=f"word NOT IN ({', '.join(repr(w) for w in STOP_WORDS)})",
            action="drop",
            name="stop words",
        ),
        RowCondition(on=COUNTS, condition="delta < 500", action="warn", name="frequent word"),
        RowCountWithinSigma(on=COUNTS, k=4, last=20, action="warn", name="batch size"),
        RowCount(on=COUNTS, min=1, action="fail", name="words in every batch"),
    ],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example"])
