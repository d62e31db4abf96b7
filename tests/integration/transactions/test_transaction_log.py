"""The transaction log as one object on a real Postgres: its engine and schema, errors, a restart,
the window that fits Spark (its parts: test_pipeline_transitions.py, tests/integration/log/)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, event, text

from airflow_txn_provider.log import schema
from airflow_txn_provider.rules.exceptions import (
    PipelineConfigError,
    SchemaTooNewError,
    SchemaTooOldError,
    UnknownPipelineError,
)
from airflow_txn_provider.rules.sources import OpaqueSource
from airflow_txn_provider.transactions.transaction_log import TransactionLog, engine_from_url
from tests.conftest import new_database
from tests.integration.log.txids_given import Counter, begin_four


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    return begin_four(txlog)


def test_expire_leases_finds_the_oldest(four):
    txlog, _ = four
    assert txlog.expire_leases("p") == ()
    txlog.renew_lease("p", 4, 1, holder="h", timeout=0)
    txlog.renew_lease("p", 3, 1, holder="h", timeout=0)
    assert txlog.expire_leases("p") == (3, 4)


class TestErrors:
    def test_unknown_pipeline(self, txlog):
        with pytest.raises(UnknownPipelineError, match="pipeline=nope"):
            txlog.begin("nope", 1, Counter())
        with pytest.raises(UnknownPipelineError):
            txlog.mark_processed("nope", 1, 1)
        with pytest.raises(UnknownPipelineError):
            txlog.last_committed("nope")

    def test_source_kind_cannot_change(self, txlog):
        txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
        with pytest.raises(PipelineConfigError):
            txlog.register_pipeline("p", source_kind="opaque", max_pending=2)

        class Other(OpaqueSource):
            def initialize_transaction(self, txid, prev):
                return {}

        with pytest.raises(PipelineConfigError):
            txlog.begin("p", 1, Other())
        txlog.register_pipeline("p", source_kind="transactional", max_pending=8)
        assert txlog.view("p").max_pending == 8

    def test_bad_arguments(self, txlog):
        with pytest.raises(ValueError):
            txlog.register_pipeline("", source_kind="opaque", max_pending=2)
        with pytest.raises(ValueError):
            txlog.register_pipeline("p", source_kind="exactly-once", max_pending=2)
        with pytest.raises(ValueError):
            txlog.register_pipeline("p", source_kind="opaque", max_pending=0)
        with pytest.raises(ValueError, match="needs Postgres"):
            engine_from_url("sqlite:///x.db")

    def test_schema_too_old(self, postgres):
        url = new_database(postgres, migrated=False)
        engine = create_engine(url)
        with pytest.raises(SchemaTooOldError, match="revision None"):
            TransactionLog(engine, migrate=False)
        TransactionLog(engine)  # migrate=True applies the migrations
        TransactionLog(engine, migrate=False)
        assert schema.current_revision(engine.connect()) == schema.head_revision()
        engine.dispose()

    @pytest.mark.parametrize("found", [None, "0007"])
    def test_a_schema_behind_the_library_is_too_old_with_the_advice_to_upgrade(
        self, postgres, found
    ):
        engine = create_engine(new_database(postgres, migrated=found is not None))
        if found is not None:
            stamp(engine, found)
        with pytest.raises(SchemaTooOldError) as err:
            schema.check(engine)
        assert f"revision {found!r}, this library needs {schema.HEAD_REVISION!r}" in str(err.value)
        assert "run airflow_txn_provider.log.schema.upgrade(engine)" in str(err.value)
        engine.dispose()

    def test_a_schema_newer_than_the_library_is_too_new_with_the_advice_to_upgrade_the_library(
        self, postgres
    ):
        """A rolling upgrade: a newer library migrated the log to a revision this one does not
        know. Alembic's "Can't locate revision" on every task, and the advice to run upgrade
        (which would fail the same way), were what it got."""
        engine = create_engine(new_database(postgres))
        stamp(engine, "9999")
        expected = (
            f"the transaction log's schema is at revision '9999', newer than this library "
            f"(knows up to {schema.HEAD_REVISION!r}): upgrade airflow-txn-provider on this "
            "machine (every worker, scheduler and api-server) to the version that wrote it; do "
            "not downgrade the database"
        )
        for call in (
            lambda: schema.check(engine),
            lambda: schema.upgrade(engine),
            lambda: TransactionLog(engine, migrate=False),
            lambda: TransactionLog(engine),  # migrate=True: upgrade() is what it calls
        ):
            with pytest.raises(SchemaTooNewError) as err:
                call()
            assert str(err.value) == expected
            assert not isinstance(err.value, SchemaTooOldError)
        with engine.connect() as conn:  # nothing was touched
            assert schema.current_revision(conn) == "9999"
        engine.dispose()


def stamp(engine, revision):
    """Set the log's recorded schema revision, as another version of the library would have."""
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {schema.VERSION_TABLE} SET version_num = :r"), {"r": revision})


def test_restart_continues_from_the_log(db_url):
    """Stop everything mid-flight, start again: nothing lost, nothing applied twice."""
    src = Counter()
    first = TransactionLog.from_url(db_url)
    first.register_pipeline("p", source_kind="transactional", max_pending=3)
    for t in (1, 2, 3):
        first.begin("p", t, src)
    first.mark_processed("p", 1, 1)
    first.mark_processed("p", 3, 1)
    first.commit("p", 1, 1)
    first.engine.dispose()  # "crash": every process is gone

    second = TransactionLog.from_url(db_url)
    assert second.recover("p") == (2, 3)  # 2 was processing: it and everything after replay
    assert second.last_committed("p") == 1
    em2, em3 = second.begin_next("p", src), second.begin_next("p", src)
    assert [(em2.txid, em2.attempt), (em3.txid, em3.attempt)] == [(2, 2), (3, 2)]
    assert em2.metadata == {"start": 10, "end": 20}
    for em in (em2, em3):
        second.mark_processed("p", em.txid, em.attempt)
        second.commit("p", em.txid, em.attempt)
    assert not second.commit("p", 1, 1).applied
    assert second.last_committed("p") == 3
    second.engine.dispose()


def test_the_schema_is_checked_once_per_engine_and_a_downgrade_is_seen(db_url):
    engine = engine_from_url(db_url)
    TransactionLog(engine)
    statements = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    TransactionLog(engine)  # known at head in this process: no query at all
    assert statements == []
    schema.upgrade(engine, "0004")  # as a test (or an operator) may
    TransactionLog(engine)  # not trusted any more: checked, and upgraded again
    with engine.connect() as conn:
        assert schema.current_revision(conn) == schema.HEAD_REVISION
    engine.dispose()


class TestWindowThatFitsSpark:
    """A pipeline with no ``max_pending`` gets the window of its Spark (rules/config.py)."""

    def test_starts_with_the_first_window_and_follows_the_cores_its_txids_see(self, txlog):
        from airflow_txn_provider.rules.config import FIRST_WINDOW, FITTED_WINDOW_BOUND

        txlog.register_pipeline("fit", source_kind="transactional", max_pending=None)
        assert txlog.view("fit").max_pending == FIRST_WINDOW
        assert txlog.fit_window("fit", 3) is True
        assert txlog.view("fit").max_pending == 4  # one per core and one beside
        assert txlog.fit_window("fit", 3) is False  # nothing to change: no write
        assert txlog.fit_window("fit", 1000) is True
        assert txlog.view("fit").max_pending == FITTED_WINDOW_BOUND
        assert txlog.fit_window("nobody", 4) is False

    def test_a_declaration_without_max_pending_keeps_the_fitted_window(self, txlog):
        txlog.register_pipeline("fit2", source_kind="transactional", max_pending=None)
        txlog.fit_window("fit2", 5)
        txlog.register_pipeline("fit2", source_kind="transactional", max_pending=None)
        assert txlog.view("fit2").max_pending == 6
        # an explicit max_pending wins
        txlog.register_pipeline("fit2", source_kind="transactional", max_pending=3)
        assert txlog.view("fit2").max_pending == 3


def test_the_outage_timeout_is_the_parts_and_cannot_be_changed_behind_them(engine):
    txlog = TransactionLog(engine, migrate=False, outage_timeout=7.5)
    parts = (txlog.pipeline_transitions, txlog.txid_transitions, txlog.reads, txlog.waker_notes)
    assert {p.outage_timeout for p in parts} == {txlog.outage_timeout} == {7.5}
    with pytest.raises(AttributeError):
        txlog.outage_timeout = 1.0  # type: ignore[misc]  # the parts would not see it
