"""A pipeline ``p`` of the log with txids begun, shared by the tests of the transaction log and of
its parts (not a test module: tests import from here, never from each other)."""

from __future__ import annotations

from sqlalchemy import text

from airflow_txn_provider.rules.sources import TransactionalSource


class Counter(TransactionalSource):
    """Batches of 10 offsets; counts how often it is asked (replays must not ask)."""

    def __init__(self):
        self.calls: list[int] = []

    def initialize_transaction(self, txid, prev):
        self.calls.append(txid)
        start = prev["end"] if prev else 0
        return {"start": start, "end": start + 10}


def begin_four(txlog):
    """Pipeline ``p``, max_pending=4, txids 1..4 emitted: ``(txlog, its source)``."""
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    src = Counter()
    for t in range(1, 5):
        assert txlog.begin("p", t, src).emitted
    return txlog, src


def statuses(txlog, pipeline="p"):
    return {t.txid: (t.attempt, t.status.value) for t in txlog.transactions(pipeline)}


def statuses_raw(txlog):
    with txlog.engine.connect() as conn:
        return conn.execute(
            text("SELECT txid, attempt, status FROM txn_transaction ORDER BY txid")
        ).all()
