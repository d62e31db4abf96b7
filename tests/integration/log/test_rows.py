"""A txid's rows and a pipeline's view (log/rows.py) on a real Postgres: an error stored with its
passwords redacted, a corrupt log reported and left as found, and the one lock of a pipeline."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from airflow_txn_provider.log.rows import lock_pipeline
from airflow_txn_provider.rules.exceptions import CorruptLogError, UnknownPipelineError
from airflow_txn_provider.rules.sources import TransactionalSource
from tests.integration.log.txids_given import begin_four, statuses_raw


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    return begin_four(txlog)


def test_a_stored_error_has_its_passwords_redacted(four):
    txlog, _ = four
    txlog.fail("p", 2, 1, error="catalog postgresql://ice:Pl4nted-S3cret@db/cat is down")
    info = txlog.transaction("p", 2)
    assert info.last_error == "catalog postgresql://ice:***@db/cat is down"
    assert txlog.attempts("p", 2)[0].error == info.last_error


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        (
            "DELETE FROM txn_attempt WHERE txid = 3;DELETE FROM txn_transaction WHERE txid = 3",
            "expected txid 3, found 4",
        ),
        ("UPDATE txn_pipeline SET last_committed_txid = 2", "last committed txid has status"),
        (
            "ALTER TABLE txn_transaction DROP CONSTRAINT ck_txn_transaction_status;"
            "UPDATE txn_transaction SET status = 'lost' WHERE txid = 2",
            "unknown status 'lost'",
        ),
    ],
)
def test_corrupt_log_is_reported_not_repaired(four, sql, match):
    txlog, src = four
    with txlog.engine.begin() as conn:
        for stmt in sql.split(";"):
            conn.execute(text(stmt))
    before = statuses_raw(txlog)
    with pytest.raises(CorruptLogError, match=match) as err:
        txlog.begin_next("p", src)
    assert err.value.pipeline == "p"
    assert statuses_raw(txlog) == before  # nothing was "fixed"


class Fixed(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


@pytest.fixture
def pipeline(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    return txlog


@pytest.mark.parametrize(
    "writer",
    [
        pytest.param(lambda txlog: txlog.begin("p", 1, Fixed()), id="begin"),
        pytest.param(lambda txlog: txlog.prune("p"), id="retention"),
        pytest.param(
            lambda txlog: txlog.register_pipeline("p", source_kind="transactional", max_pending=5),
            id="declaration",
        ),
    ],
)
def test_every_writer_of_a_pipeline_waits_for_its_one_lock(pipeline, writer):
    """The transitions, retention and the declaration all take ``lock_pipeline`` first: while
    another transaction holds it, each waits, and goes on once it is released."""
    done = threading.Event()
    with pipeline.engine.begin() as conn:
        row = lock_pipeline(conn, "p")
        assert row.name == "p" and row.db_now is not None
        worker = threading.Thread(target=lambda: (writer(pipeline), done.set()), daemon=True)
        worker.start()
        assert not done.wait(1.0), "a writer went on while another transaction held the lock"
    assert done.wait(30), "the writer never went on once the lock was released"
    worker.join()


def test_locking_an_unknown_pipeline_is_a_typed_error(pipeline):
    with pipeline.engine.begin() as conn, pytest.raises(UnknownPipelineError) as err:
        lock_pipeline(conn, "nope")
    assert err.value.pipeline == "nope"
