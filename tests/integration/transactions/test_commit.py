"""The commit protocol's shared steps (transactions/commit.py) on a real Postgres log: committing
the processed txids that are ready, in order, from the view given."""

from __future__ import annotations

from airflow_txn_provider.transactions.commit import commit_ready
from tests.integration.transactions.test_commit_in_turn import LOG, two_processing


def test_commit_ready_starts_from_the_view_given_and_reads_the_log_after_it(txlog):
    txn_pipeline = two_processing(txlog, "t")
    txlog.mark_processed("t", 1, 1, {"rows": 10})
    before = txlog.view("t")  # both processed: the first commit needs no read of its own
    reads: list[str] = []
    real_view = txlog.view

    def counted(name):
        reads.append(name)
        return real_view(name)

    txlog.view = counted
    try:
        assert commit_ready(txlog, txn_pipeline, LOG, view=before) == [1, 2]
    finally:
        del txlog.view
    assert len(reads) == 2  # after txid 1 and after txid 2: none for the first look
    assert txlog.view("t").last_committed == 2
