"""The commit protocol's shared steps (transactions/commit.py) on a real Postgres log: committing
the processed txids that are ready, in order, from the view given."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.transactions.commit import commit_ready

LOG = logging.getLogger(__name__)


class Tens(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"start": (prev or {"end": 0})["end"], "end": txid * 10}


def _two_processing(txlog, name: str) -> SimpleNamespace:
    """Txids 1 and 2 begun; 2 processed first: its task waits for 1."""
    txlog.register_pipeline(name, source_kind="transactional", max_pending=4)
    for txid in (1, 2):
        assert txlog.begin(name, txid, Tens()).emitted
    txlog.mark_processed(name, 2, 1, {"rows": 20})
    return SimpleNamespace(name=name, window_bound=4, sinks=())


def test_commit_ready_starts_from_the_view_given_and_reads_the_log_after_it(txlog):
    pipeline = _two_processing(txlog, "t")
    txlog.mark_processed("t", 1, 1, {"rows": 10})
    before = txlog.view("t")  # both processed: the first commit needs no read of its own
    reads: list[str] = []
    real_view = txlog.view

    def counted(name):
        reads.append(name)
        return real_view(name)

    txlog.view = counted
    try:
        assert commit_ready(txlog, pipeline, LOG, view=before) == [1, 2]
    finally:
        del txlog.view
    assert len(reads) == 2  # after txid 1 and after txid 2: none for the first look
    assert txlog.view("t").last_committed == 2
