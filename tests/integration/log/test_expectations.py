"""What the log keeps of the audits (``log/expectations.py``), on a real Postgres."""

from __future__ import annotations

from airflow_txn_provider.log.expectations import (
    committed_counts,
    committed_outcomes,
    quarantined_counts,
    take_back_quarantined,
)
from airflow_txn_provider.log.rows import TxidRows
from airflow_txn_provider.rules.sources import TransactionalSource


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _outcome(name, n):
    return {"expectation": name, "rows_checked": n, "taken": "passed"}


def test_a_sigma_bounds_history_is_the_committed_attempts_counts_oldest_first(txlog):
    p = "hist"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=3)
    for txid in range(1, 6):
        a = txlog.begin(p, txid, Batches()).attempt
        txlog.stage_output(p, txid, a, lambda c: {})
        with txlog.engine.begin() as conn:
            outcomes = [_outcome("n", 10 * txid)] + ([_outcome("m", txid)] if txid % 2 else [])
            TxidRows(conn, p, txid).record_expectations(a, outcomes)
        if txid < 5:
            assert txlog.commit(p, txid, a).applied
    # a failed attempt's outcomes are not history: txid 3's second attempt is never committed
    with txlog.engine.connect() as conn:
        assert committed_counts(conn, p, ["n", "m"], 3, before_txid=5) == {
            "n": [20, 30, 40],
            "m": [3],
        }
        assert committed_counts(conn, p, ["n"], 10, before_txid=3) == {"n": [10, 20]}
        assert [t for t, _ in committed_outcomes(conn, p, 10)] == [1, 2, 3, 4]  # 5 not committed


def test_a_rewind_takes_back_the_quarantine_of_its_txids_per_output(txlog):
    p = "qback"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=3)
    with txlog.engine.begin() as conn:
        for txid, output in [(1, "a"), (2, "a"), (2, "b"), (3, "b"), (3, "b")]:
            conn.exec_driver_sql(
                "INSERT INTO txn_quarantine (pipeline, output, txid, attempt, expectations, row) "
                "VALUES (%s, %s, %s, 1, ARRAY['e'], '{}')",
                (p, output, txid),
            )
    with txlog.engine.begin() as conn:
        assert take_back_quarantined(conn, p, 2) == {"a": 1, "b": 3}
        assert quarantined_counts(conn, p) == {"a": 1}


def test_an_outcome_the_job_never_measured_is_not_in_a_sigma_bounds_history(txlog):
    from airflow_txn_provider.rules.expectations import NOT_MEASURED

    p = "unmeasured"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=3)
    for txid, outcome in [
        (1, _outcome("n", 7)),
        (2, {**_outcome("n", 0), "message": NOT_MEASURED}),
    ]:
        a = txlog.begin(p, txid, Batches()).attempt
        txlog.stage_output(p, txid, a, lambda c: {})
        with txlog.engine.begin() as conn:
            TxidRows(conn, p, txid).record_expectations(a, [outcome])
        assert txlog.commit(p, txid, a).applied
    with txlog.engine.connect() as conn:
        assert committed_counts(conn, p, ["n"], 5, before_txid=3) == {"n": [7]}
