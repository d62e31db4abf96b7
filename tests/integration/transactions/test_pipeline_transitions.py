"""The log's transitions under the pipeline's lock (transactions/pipeline_transitions.py) on a real
Postgres: Storm's scenarios, begin, commit, fail and an expired lease, and a begin's errors."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.exceptions import (
    NotProcessedError,
    OutOfOrderCommitError,
    SourceError,
    UnreadableMetadataError,
)
from airflow_txn_provider.rules.sources import OpaqueSource, TransactionalSource
from airflow_txn_provider.rules.vocabulary import (
    BeginAction,
    LeaseRenewal,
    ProcessedAction,
    TxStatus,
)
from tests.integration.log.txids_given import Counter, begin_four, statuses


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    return begin_four(txlog)


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
