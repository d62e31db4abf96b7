"""The transaction log on a real Postgres: Storm's scenarios, errors, history, restart."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, event, text

from airflow_txn_provider.log import schema
from airflow_txn_provider.rules.exceptions import (
    CorruptLogError,
    NotProcessedError,
    OutOfOrderCommitError,
    PipelineConfigError,
    SchemaTooNewError,
    SchemaTooOldError,
    SourceError,
    StaleAttemptError,
    UnknownPipelineError,
    UnreadableMetadataError,
)
from airflow_txn_provider.rules.sources import OpaqueSource, TransactionalSource
from airflow_txn_provider.rules.vocabulary import (
    BeginAction,
    LeaseRenewal,
    ProcessedAction,
    TxStatus,
)
from airflow_txn_provider.transactions.transaction_log import TransactionLog, engine_from_url
from tests.conftest import new_database


class Counter(TransactionalSource):
    """Batches of 10 offsets; counts how often it is asked (replays must not ask)."""

    def __init__(self):
        self.calls: list[int] = []

    def initialize_transaction(self, txid, prev):
        self.calls.append(txid)
        start = prev["end"] if prev else 0
        return {"start": start, "end": start + 10}


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    src = Counter()
    for t in range(1, 5):
        assert txlog.begin("p", t, src).emitted
    return txlog, src


def statuses(txlog, pipeline="p"):
    return {t.txid: (t.attempt, t.status.value) for t in txlog.transactions(pipeline)}


class TestStormScenarios:
    def test_failing_txid_2_reemits_2_3_4_and_leaves_1(self, four):
        txlog, src = four
        txlog.mark_processed("p", 1, 1)
        txlog.mark_processed("p", 3, 1)
        assert txlog.fail("p", 2, 1, error="executor lost") == (2, 3, 4)
        assert statuses(txlog) == {
            1: (1, "processed"),
            2: (1, "failed"),
            3: (1, "failed"),
            4: (1, "failed"),
        }
        replays = [txlog.begin_next("p", src) for _ in range(3)]
        assert [(e.txid, e.attempt, e.action) for e in replays] == [
            (2, 2, BeginAction.REPLAY),
            (3, 2, BeginAction.REPLAY),
            (4, 2, BeginAction.REPLAY),
        ]
        # Transactional source: replays reuse the stored batch, the source is not asked again.
        assert src.calls == [1, 2, 3, 4]
        assert [e.metadata for e in replays] == [
            {"start": 10, "end": 20},
            {"start": 20, "end": 30},
            {"start": 30, "end": 40},
        ]
        # txid 1 kept its attempt and processed output and commits as it is.
        assert txlog.commit("p", 1, 1).applied

    def test_a_stored_error_has_its_passwords_redacted(self, four):
        txlog, _ = four
        txlog.fail("p", 2, 1, error="catalog postgresql://ice:Pl4nted-S3cret@db/cat is down")
        info = txlog.transaction("p", 2)
        assert info.last_error == "catalog postgresql://ice:***@db/cat is down"
        assert txlog.attempts("p", 2)[0].error == info.last_error

    def test_late_processed_from_old_attempt_is_ignored(self, four):
        txlog, src = four
        txlog.fail("p", 2, 1)
        txlog.begin("p", 2, src)
        assert txlog.mark_processed("p", 2, 1, {"rows": 1}) is ProcessedAction.IGNORE_STALE
        assert statuses(txlog)[2] == (2, "processing")
        with pytest.raises(StaleAttemptError):
            txlog.commit("p", 2, 1)

    def test_commit_failure_replays_the_whole_transaction(self, four):
        txlog, src = four
        for t in (1, 2, 3):
            txlog.mark_processed("p", t, 1)
        txlog.commit("p", 1, 1)

        def broken(conn, record):
            conn.execute(text("CREATE TABLE half_applied (x int)"))
            raise ConnectionError("sink went away")

        with pytest.raises(ConnectionError):
            txlog.commit("p", 2, 1, broken)
        assert statuses(txlog) == {
            1: (1, "committed"),
            2: (1, "failed"),
            3: (1, "failed"),
            4: (1, "failed"),
        }
        with txlog.engine.connect() as conn:  # nothing of the failed commit was kept
            assert conn.execute(text("SELECT to_regclass('half_applied')")).scalar() is None
        assert txlog.last_committed("p") == 1
        em = txlog.begin("p", 2, src)
        assert (em.action, em.attempt) == (BeginAction.REPLAY, 2)
        assert txlog.attempts("p", 2)[0].error == "commit failed: sink went away"


class TestRules:
    def test_out_of_order_commit_is_refused(self, four):
        txlog, _ = four
        txlog.mark_processed("p", 2, 1)
        with pytest.raises(OutOfOrderCommitError, match="txid 1 has not committed") as err:
            txlog.commit("p", 2, 1)
        assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 2, 1)

    def test_commit_needs_processed_output(self, four):
        txlog, _ = four
        with pytest.raises(NotProcessedError):
            txlog.commit("p", 1, 1)

    def test_commit_is_idempotent(self, four):
        txlog, _ = four
        txlog.mark_processed("p", 1, 1)
        applied = []
        assert txlog.commit("p", 1, 1, lambda c, r: applied.append(r.txid)).applied
        again = txlog.commit("p", 1, 1, lambda c, r: applied.append(r.txid))
        assert not again.applied and again.committed_attempt == 1
        assert applied == [1]

    def test_window_blocks_then_frees(self, four):
        txlog, src = four
        assert txlog.begin("p", 5, src).action is BeginAction.WAIT_WINDOW
        assert txlog.begin_next("p", src) is None
        txlog.mark_processed("p", 1, 1)
        txlog.commit("p", 1, 1)
        assert txlog.begin("p", 5, src).emitted

    def test_begin_waits_for_previous_txid(self, txlog):
        txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
        assert txlog.begin("p", 2, Counter()).action is BeginAction.WAIT_PREVIOUS

    def test_no_data_allocates_nothing(self, txlog):
        class Empty(TransactionalSource):
            def initialize_transaction(self, txid, prev):
                return None

        txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
        em = txlog.begin("p", 1, Empty())
        assert em.no_data and not em.emitted
        assert txlog.transactions("p") == []

    def test_begin_again_resumes_the_live_attempt(self, four):
        """Airflow may lose a begin's success report and retry it: the retry gets the same
        attempt back, never a re-emission (that would fail the txid and every later one)."""
        txlog, src = four
        txlog.mark_processed("p", 3, 1)
        for txid in (2, 3):
            em = txlog.begin("p", txid, src)
            assert (em.action, em.attempt, em.emitted, em.resumed) == (
                BeginAction.RESUME,
                1,
                True,
                True,
            )
            assert em.metadata == txlog.transaction("p", txid).metadata
        assert [len(txlog.attempts("p", t)) for t in (1, 2, 3, 4)] == [1, 1, 1, 1]
        assert statuses(txlog)[2] == (1, "processing") and statuses(txlog)[3] == (1, "processed")

    def test_an_expired_lease_fails_the_attempt_and_later_ones(self, four):
        txlog, src = four
        renewed = txlog.renew_lease("p", 2, 1, holder="task process_x pid 42", timeout=0)
        assert renewed is LeaseRenewal.RENEWED
        assert txlog.expire_lease("p", 3, 1) == ()  # its lease (the claim's) is alive
        assert txlog.expire_lease("p", 2, 1) == (2, 3, 4)
        info = txlog.transaction("p", 2)
        assert info.status is TxStatus.FAILED and info.failed_by == 2
        assert "pipeline=p txid=2 attempt=1: lease expired" in info.last_error
        assert "task process_x pid 42" in info.last_error
        assert txlog.renew_lease("p", 2, 1, holder="late", timeout=30) is LeaseRenewal.LOST
        assert txlog.expire_lease("p", 2, 1) == ()  # idempotent
        assert txlog.begin("p", 2, src).action is BeginAction.REPLAY

    def test_begin_after_an_expired_lease_reemits(self, four):
        txlog, src = four
        txlog.renew_lease("p", 3, 1, holder="h", timeout=0)
        em = txlog.begin("p", 3, src)
        assert (em.action, em.attempt, em.invalidated) == (BeginAction.REEMIT, 2, (3, 4))
        assert txlog.mark_processed("p", 3, 1) is ProcessedAction.IGNORE_STALE
        assert statuses(txlog)[4] == (1, "failed")

    def test_a_replay_of_a_claim_that_ran_out_unstarted_gets_a_longer_claim(self, txlog):
        """A replay storm's brake (``fencing.claim_timeout_for``), by the database's clock."""
        txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
        src, base = Counter(), 0.2

        def claim_of(txid: int) -> float:
            info = txlog.transaction("p", txid)
            return (info.lease_expires_at - info.begun_at).total_seconds()

        def expire(txid: int) -> None:
            deadline = time.monotonic() + 10
            while not txlog.expire_leases("p") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert txlog.transaction("p", txid).status is TxStatus.FAILED

        assert txlog.begin("p", 1, src, claim_timeout=base).emitted
        assert claim_of(1) == pytest.approx(base, abs=0.01)
        expire(1)  # its processing never started
        assert txlog.begin("p", 1, src, claim_timeout=base).attempt == 2
        assert claim_of(1) == pytest.approx(2 * base, abs=0.01)
        expire(1)
        assert txlog.begin("p", 1, src, claim_timeout=base).attempt == 3
        assert claim_of(1) == pytest.approx(4 * base, abs=0.01)
        # this one's processing starts, renews, then dies: the next claim is the caller's again
        txlog.renew_lease("p", 1, 3, holder="task process_x pid 42", timeout=0)
        expire(1)
        assert txlog.begin("p", 1, src, claim_timeout=base).attempt == 4
        assert claim_of(1) == pytest.approx(base, abs=0.01)

    def test_expire_leases_finds_the_oldest(self, four):
        txlog, _ = four
        assert txlog.expire_leases("p") == ()
        txlog.renew_lease("p", 4, 1, holder="h", timeout=0)
        txlog.renew_lease("p", 3, 1, holder="h", timeout=0)
        assert txlog.expire_leases("p") == (3, 4)

    def test_attempt_history_keeps_every_attempt(self, four):
        txlog, src = four
        txlog.fail("p", 1, 1, error="first")
        txlog.begin("p", 1, src)
        txlog.mark_processed("p", 1, 2, {"rows": 7})
        txlog.commit("p", 1, 2)
        history = txlog.attempts("p", 1)
        assert [(a.attempt, a.status, a.error) for a in history] == [
            (1, TxStatus.FAILED, "first"),
            (2, TxStatus.COMMITTED, None),
        ]
        assert history[1].output == {"rows": 7} and history[1].ended_at is not None
        assert all(a.metadata == {"start": 0, "end": 10} for a in history)

    def test_opaque_replay_starts_where_the_previous_txid_ended(self, txlog):
        available = {"n": 25}

        class Landing(OpaqueSource):
            def initialize_transaction(self, txid, prev):
                start = prev["end"] if prev else 0
                end = min(available["n"], start + 10)
                return {"start": start, "end": end} if end > start else None

        src = Landing()
        txlog.register_pipeline("o", source_kind="opaque", max_pending=4)
        assert [txlog.begin("o", t, src).metadata for t in (1, 2, 3)] == [
            {"start": 0, "end": 10},
            {"start": 10, "end": 20},
            {"start": 20, "end": 25},
        ]
        txlog.mark_processed("o", 1, 1)
        txlog.commit("o", 1, 1)
        txlog.fail("o", 2, 1)
        available["n"] = 15  # records 15.. went away
        assert txlog.begin("o", 2, src).metadata == {"start": 10, "end": 15}
        available["n"] = 40
        assert txlog.begin("o", 3, src).metadata == {"start": 15, "end": 25}


class TestErrors:
    def test_unknown_pipeline(self, txlog):
        with pytest.raises(UnknownPipelineError, match="pipeline=nope"):
            txlog.begin("nope", 1, Counter())
        with pytest.raises(UnknownPipelineError):
            txlog.mark_processed("nope", 1, 1)
        with pytest.raises(UnknownPipelineError):
            txlog.last_committed("nope")

    def test_unserialisable_metadata_is_refused_and_nothing_stored(self, txlog):
        class Tuples(TransactionalSource):
            def initialize_transaction(self, txid, prev):
                return {"p0": (0, 10)}

        txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
        with pytest.raises(UnreadableMetadataError, match="tuple") as err:
            txlog.begin("p", 1, Tuples())
        assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 1, 1)
        assert txlog.transactions("p") == []

    def test_source_failure_is_typed(self, txlog):
        class Missing(TransactionalSource):
            def initialize_transaction(self, txid, prev):
                raise FileNotFoundError("partition p=7 is missing")

        txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
        with pytest.raises(SourceError, match="partition p=7 is missing") as err:
            txlog.begin("p", 1, Missing())
        assert (err.value.txid, err.value.attempt) == (1, 1)

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
    def test_corrupt_log_is_reported_not_repaired(self, four, sql, match):
        txlog, src = four
        with txlog.engine.begin() as conn:
            for stmt in sql.split(";"):
                conn.execute(text(stmt))
        before = statuses_raw(txlog)
        with pytest.raises(CorruptLogError, match=match) as err:
            txlog.begin_next("p", src)
        assert err.value.pipeline == "p"
        assert statuses_raw(txlog) == before  # nothing was "fixed"

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


def statuses_raw(txlog):
    with txlog.engine.connect() as conn:
        return conn.execute(
            text("SELECT txid, attempt, status FROM txn_transaction ORDER BY txid")
        ).all()


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


def test_an_unlocked_view_is_one_snapshot_while_a_commit_lands(four, db_url):
    """The page, the gate sensor and the trigger read without the lock: a commit landing between
    the view's two statements (pipeline row, then txid rows) must not look like a corrupt log."""
    txlog, _ = four
    for t in (1, 2):
        txlog.mark_processed("p", t, 1)
    other = TransactionLog.from_url(db_url, migrate=False)
    fired = []

    def commit_between(conn, cursor, statement, *args):
        if not fired and "FROM txn_pipeline" in statement and "FOR UPDATE" not in statement:
            fired.append(statement)
            other.commit("p", 1, 1)  # another process commits txid 1 right now

    event.listen(txlog.engine, "after_cursor_execute", commit_between)
    try:
        view = txlog.view("p")
    finally:
        event.remove(txlog.engine, "after_cursor_execute", commit_between)
        other.engine.dispose()
    assert fired
    assert view.last_committed == 0 and view.record(1).status.value == "processed"
    assert txlog.view("p").last_committed == 1


def test_an_attempt_records_where_its_time_went(four):
    """The job's timings come with its output, the commit adds its own; a stale report adds none."""
    txlog, _ = four
    output = lambda conn: {"s": 3}  # noqa: E731
    txlog.stage_output("p", 1, 1, output, timings={"start": 1.23456, "spark": 2.5})
    txlog.commit("p", 1, 1)
    (first,) = txlog.attempts("p", 1)
    assert set(first.timings) == {"start", "spark", "commit"}
    assert first.timings["start"] == 1.235 and first.timings["spark"] == 2.5  # rounded to ms
    assert 0 <= first.timings["commit"] < 60
    txlog.fail("p", 2, 1, error="boom")
    assert txlog.stage_output("p", 2, 1, output, timings={"spark": 9.0}) is (
        ProcessedAction.IGNORE_STALE
    )
    assert txlog.attempts("p", 2)[0].timings == {}


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


def test_a_begin_lets_the_source_prefetch_before_it_takes_the_pipeline_lock(txlog, db_url):
    """A source reads what it needs (new footers) while other begins may hold the lock; a
    failing prefetch is not an error: the same work, under the lock, reports it."""
    txlog.register_pipeline("pre", source_kind="transactional", max_pending=2)
    probe = create_engine(db_url)
    seen: list[bool] = []

    class Prefetching(Counter):
        def prefetch(self):
            with probe.connect() as conn:  # the pipeline's row: locked now or not?
                locked = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                        "WHERE c.relname = 'txn_pipeline' AND l.mode = 'RowShareLock'"
                    )
                ).scalar()
            seen.append(bool(locked))
            if len(seen) == 2:
                raise OSError("listing failed")

    src = Prefetching()
    assert txlog.begin("pre", 1, src).emitted
    assert txlog.begin_next("pre", src).txid == 2  # its prefetch fails: the begin does not
    assert seen == [False, False] and src.calls == [1, 2]
    probe.dispose()


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
