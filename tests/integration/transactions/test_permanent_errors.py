"""A permanent database error fails the txid at once, through the cascade, with the error in the
log (issue 25): real errors raised by a real Postgres inside a real commit. Before, a
ProgramLimitExceeded or a statement timeout (OperationalError subclasses) was retried for three
minutes and then left the txid ``processed`` with no error anywhere."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


ERRORS = {
    # SQLSTATE: a statement that raises it in the commit's transaction
    "22012": "SELECT 1 / 0",
    "22003": "SELECT 2147483647::integer + 1",
    "23505": "CREATE TEMP TABLE u (k int PRIMARY KEY); INSERT INTO u VALUES (1), (1)",
    "42P01": "SELECT * FROM no_such_table",
    "54000": "CREATE TEMP TABLE big (k text PRIMARY KEY); "
    "INSERT INTO big SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i",
    "57014": "SET LOCAL statement_timeout = 50; SELECT pg_sleep(5)",
}


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_a_permanent_error_in_the_commit_fails_the_txid_at_once(txlog, code):
    pipeline = f"perm_{code.lower()}"
    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=3)
    first = txlog.begin(pipeline, 1, Batches())
    later = txlog.begin(pipeline, 2, Batches())
    txlog.mark_processed(pipeline, 1, first.attempt, {"rows": 0})

    def apply(conn, record):
        for statement in ERRORS[code].split("; "):
            conn.execute(text(statement))

    started = time.monotonic()
    with pytest.raises(DBAPIError) as err:
        txlog.commit(pipeline, 1, first.attempt, apply)
    assert err.value.orig.sqlstate == code
    assert time.monotonic() - started < 10  # not three minutes of retries
    one = txlog.transaction(pipeline, 1)
    assert one.status is TxStatus.FAILED and one.last_error.startswith("commit failed:")
    assert txlog.transaction(pipeline, 2).status is TxStatus.FAILED  # the cascade
    assert txlog.transaction(pipeline, 2).attempt == later.attempt
    assert txlog.last_committed(pipeline) == 0
