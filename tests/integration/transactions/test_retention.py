"""Retention on a real Postgres: a long pipeline's log stays bounded, what is pruned is summarised
exactly, nothing the rules read is ever pruned (begin, commit, failure and replay keep working
across pruning), and the Transactions page's numbers stay exact without scanning the state.

Ground truth is computed in plain Python beside the pipeline.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter as Tally
from datetime import datetime

import pytest
from sqlalchemy import text

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.config import PRUNE_EVERY
from airflow_txn_provider.rules.sources import OpaqueSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import model, reader

pytestmark = pytest.mark.integration


class Offsets(OpaqueSource):
    """An opaque source over one growing partition: each txid takes ``step`` records from where
    the previous txid ended (``prev_metadata``), so a replay that started anywhere else would show
    as a gap or an overlap in the committed ranges."""

    def __init__(self, step: int = 5) -> None:
        self.step = step

    def initialize_transaction(self, txid, prev_metadata):
        start = prev_metadata["end"] if prev_metadata else 0
        return {"start": start, "end": start + self.step}


def rows_of(engine, pipeline: str) -> tuple[int, int]:
    with engine.connect() as conn:
        txns = conn.execute(
            text("SELECT count(*) FROM txn_transaction WHERE pipeline = :p"), {"p": pipeline}
        ).scalar_one()
        attempts = conn.execute(
            text("SELECT count(*) FROM txn_attempt WHERE pipeline = :p"), {"p": pipeline}
        ).scalar_one()
    return int(txns), int(attempts)


def expected_top(truth: dict[str, int], k: int = model.TOP_KEYS) -> list[dict]:
    ranked = sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [{"key": key, "value": value} for key, value in ranked]


@pytest.mark.scenario  # make test-scenarios (~1.5 min); CI: the other retention tests here
def test_a_long_pipeline_stays_bounded_and_exact(engine):
    """1 500 txids (some failing once and replayed, some committing with a negative delta):
    txn_transaction / txn_attempt never hold more than keep_txids + max_pending + PRUNE_EVERY
    txids' rows, the pruned totals equal what happened, and the page's state summary equals the
    ground truth at every checkpoint."""
    txlog = TransactionLog(engine)
    keep, pending, total_txids = 100, 3, 1500
    counts = MapState("long", "long_counts", "transactional", keys={"word": "text"}).create(engine)
    txlog.register_pipeline("long", source_kind="opaque", max_pending=pending, keep_txids=keep)
    src = Offsets()
    rng = random.Random(7)
    words = [f"w{i:03d}" for i in range(300)]
    truth: Tally[str] = Tally()
    attempts_of: dict[int, int] = {}
    failed_of: dict[int, int] = {}
    ends: list[tuple[int, int]] = []
    bound = keep + pending + PRUNE_EVERY

    for txid in range(1, total_txids + 1):
        em = txlog.begin("long", txid, src)
        assert em.emitted, em
        attempts_of[txid] = 1
        if txid % 97 == 0:  # fails once, replays (opaque: from where txid - 1 ended)
            txlog.fail("long", txid, em.attempt, error="injected")
            failed_of[txid] = 1
            em = txlog.begin("long", txid, src)
            assert em.attempt == 2
            attempts_of[txid] = 2
        batch = Tally({rng.choice(words): rng.randint(1, 9) for _ in range(rng.randint(1, 6))})
        if txid % 11 == 0:
            batch[rng.choice(words)] -= 20  # values go down too: the top keys must follow
        with engine.begin() as conn:
            counts.stage(conn, txid, em.attempt, [(w, d) for w, d in batch.items()])
        txlog.mark_processed("long", txid, em.attempt, {counts.output_key: len(batch)})
        commit_states(txlog, "long", txid, em.attempt, [counts])
        truth.update(batch)
        ends.append((em.metadata["start"], em.metadata["end"]))

        txns, attempts = rows_of(engine, "long")
        assert txns <= bound and attempts <= 2 * bound, (txid, txns, attempts)
        if txid in (500, 1000, total_txids):
            info = txlog.retention("long")
            pruned = range(1, info.pruned_through_txid + 1)
            assert info.pruned_through_txid >= txid - keep - PRUNE_EVERY
            assert info.pruned_txids == len(pruned)
            assert info.pruned_attempts == sum(attempts_of[t] for t in pruned)
            assert info.pruned_failed_attempts == sum(failed_of.get(t, 0) for t in pruned)
            assert txns == txid - info.pruned_through_txid  # nothing else was deleted
            [summary] = reader.state_summaries(engine, "long", txid)
            assert summary["keys"] == len(truth)
            assert summary["sum"] == sum(truth.values())
            assert summary["top"] == expected_top(truth)
            page = reader.pipeline_payload(txlog, "long", datetime.now(UTC))
            assert page["pipeline"]["last_committed"] == txid
            listed = [t["txid"] for t in page["txids"]]
            assert listed == list(range(txid, info.pruned_through_txid, -1))
            assert page["retention"]["pruned_txids"] == info.pruned_txids
            said = {"complete": "complete from txid 1", "partial": False}
            assert page["states"] == [{**summary, **said}]
    # The committed batches are contiguous: every replay started where txid - 1 ended.
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    with engine.connect() as conn:  # the kept summary equals a full count
        n, total = conn.execute(text(f"SELECT count(*), sum(value) FROM {counts.table}")).one()
    assert (n, total) == (len(truth), sum(truth.values()))
    assert counts.summary(engine.connect()) == (len(truth), sum(truth.values()))


def test_pruning_never_touches_txids_in_flight_and_replay_works_after_it(engine):
    txlog = TransactionLog(engine)
    txlog.register_pipeline("p", source_kind="opaque", max_pending=3, keep_txids=1)
    src = Offsets()
    for txid in range(1, 41):
        em = txlog.begin("p", txid, src)
        txlog.mark_processed("p", txid, em.attempt, {})
        txlog.commit("p", txid, em.attempt)
    # In flight: 41 processed, 42 processing, 43 failed (with history of two attempts).
    e41 = txlog.begin("p", 41, src)
    txlog.mark_processed("p", 41, e41.attempt, {})
    txlog.begin("p", 42, src)
    e43 = txlog.begin("p", 43, src)
    txlog.fail("p", 43, e43.attempt, error="boom")
    before = {t.txid: t for t in txlog.transactions("p", since_txid=39)}
    history_43 = txlog.attempts("p", 43)

    while txlog.prune("p", batch=7):  # bounded: 7 txids per call, until nothing is due
        pass
    assert txlog.prune("p") == 0  # idempotent
    kept = {t.txid: t for t in txlog.transactions("p")}
    assert sorted(kept) == [40, 41, 42, 43]  # the last committed txid and every txid in flight
    assert all(kept[t] == before[t] for t in (40, 41, 42, 43))
    assert txlog.attempts("p", 43) == history_43  # a failed txid's history: the sensor reads it
    info = txlog.retention("p")
    assert (info.pruned_txids, info.pruned_attempts, info.pruned_through_txid) == (39, 39, 39)

    # The rules still work: 43 fails 41..43 on a cascade from 41, all replay in order from
    # where txid 40 ended (its metadata survived), commit, and pruning goes on.
    assert txlog.fail("p", 41, e41.attempt, error="late failure") == (41, 42)  # 43 had failed
    starts = {}
    for txid in (41, 42, 43):
        em = txlog.begin("p", txid, src)
        assert em.emitted and em.attempt >= 2
        starts[txid] = em.metadata["start"]
        txlog.mark_processed("p", txid, em.attempt, {})
    assert starts == {41: 200, 42: 205, 43: 210}  # txid 40 ended at 200
    for txid in (41, 42, 43):
        assert txlog.commit("p", txid, txlog.transaction("p", txid).attempt).applied
    assert txlog.prune("p") == 3  # 40..42: older than the last committed txid
    # A duplicate commit of a pruned txid is a no-op; begin of one says it committed.
    again = txlog.commit("p", 5, 1)
    assert (again.applied, again.committed_attempt) == (False, 0)
    assert txlog.begin("p", 5, src).action.value == "already_committed"
    assert txlog.transaction("p", 5) is None
    assert txlog.fail("p", 5, 1, error="late report") == ()
    view = txlog.view("p")
    assert view.last_committed == 43 and view.last_committed_metadata == {"start": 210, "end": 215}
    now = datetime.now(UTC)
    pruned_page = reader.txid_payload(txlog, "p", 5, now)
    assert pruned_page["pruned"] and pruned_page["current"] is None
    assert not reader.txid_payload(txlog, "p", 50, now)["pruned"]  # not begun yet: not pruned


def test_a_late_report_of_a_pruned_txid_is_ignored_as_stale(engine):
    """A processing task's report that arrives after its txid committed and was pruned (found by
    the log's state machine): ignored as stale, stages nothing, not 'never begun'."""
    from airflow_txn_provider.rules.vocabulary import ProcessedAction

    txlog = TransactionLog(engine)
    txlog.register_pipeline("late", source_kind="opaque", max_pending=1, keep_txids=1)
    for txid in (1, 2):
        em = txlog.begin("late", txid, Offsets())
        txlog.mark_processed("late", txid, em.attempt, {})
        txlog.commit("late", txid, em.attempt)
    while txlog.prune("late"):
        pass
    assert 1 not in {t.txid for t in txlog.transactions("late")}
    assert txlog.mark_processed("late", 1, 1, {}) is ProcessedAction.IGNORE_STALE
    assert txlog.stage("late", 1, 1, lambda conn: {"x": 1}) is False
    with pytest.raises(Exception, match="never begun"):  # a txid not begun yet is still refused
        txlog.mark_processed("late", 3, 1, {})


def test_commits_prune_by_themselves_and_concurrent_prunes_count_once(engine):
    txlog = TransactionLog(engine)
    txlog.register_pipeline("c", source_kind="opaque", max_pending=1, keep_txids=5)
    src = Offsets()
    for txid in range(1, 6 + PRUNE_EVERY):
        em = txlog.begin("c", txid, src)
        txlog.mark_processed("c", txid, em.attempt, {})
        txlog.commit("c", txid, em.attempt)
    assert txlog.retention("c").pruned_through_txid == PRUNE_EVERY  # by the commit itself
    txlog.register_pipeline("c", source_kind="opaque", max_pending=1, keep_txids=1)
    for txid in range(6 + PRUNE_EVERY, 60):
        em = txlog.begin("c", txid, src)
        txlog.mark_processed("c", txid, em.attempt, {})
        txlog.commit("c", txid, em.attempt)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(txlog.prune("c", batch=3))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while txlog.prune("c"):
        pass
    info = txlog.retention("c")
    assert info.pruned_through_txid == 58
    assert info.pruned_txids == info.pruned_attempts == 58  # each txid counted once
    assert sum(results) <= 58
    assert [t.txid for t in txlog.transactions("c")] == [59]


def test_keep_txids_is_validated_and_changes_on_registration(txlog):
    with pytest.raises(ValueError, match="keep_txids"):
        txlog.register_pipeline("v", source_kind="opaque", max_pending=1, keep_txids=0)
    txlog.register_pipeline("v", source_kind="opaque", max_pending=1)
    assert txlog.retention("v").keep_txids == 1000  # the default
    txlog.register_pipeline("v", source_kind="opaque", max_pending=1, keep_txids=50)
    txlog.register_pipeline("v", source_kind="opaque", max_pending=2)  # None: left as it is
    assert txlog.retention("v").keep_txids == 50


def test_a_state_without_a_summary_gets_one_at_its_next_commit(engine):
    """A state of an earlier version has no summary row: the page counts it (once per commit),
    and its next commit starts the summary from a full count."""
    txlog = TransactionLog(engine)
    counts = MapState("old", "old_counts", "transactional", keys={"k": "bigint"}).create(engine)
    txlog.register_pipeline("old", source_kind="opaque", max_pending=1)
    src = Offsets()

    def commit(txid: int, rows: list[tuple[int, int]]) -> None:
        em = txlog.begin("old", txid, src)
        with engine.begin() as conn:
            counts.stage(conn, txid, em.attempt, rows)
        txlog.mark_processed("old", txid, em.attempt, {counts.output_key: len(rows)})
        commit_states(txlog, "old", txid, em.attempt, [counts])

    commit(1, [(1, 5), (2, 7)])
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM txn_map_summary"))
    [s] = reader.state_summaries(engine, "old")
    assert (s["keys"], s["sum"]) == (2, 12)
    commit(2, [(2, 1), (3, 4)])
    with engine.connect() as conn:
        assert counts.summary(conn) == (3, 17)
    [s] = reader.state_summaries(engine, "old")
    assert (s["keys"], s["sum"], s["top"][0]) == (3, 17, {"key": "2", "value": 8})


def test_the_top_keys_of_a_large_state_are_not_scanned_at_every_commit(engine, monkeypatch):
    """Count and sum follow every commit; the top keys of a state past TOP_KEYS_EXACT_UP_TO keys
    (a scan of the table) are read at most every TOP_KEYS_REFRESH_S seconds."""
    monkeypatch.setattr(reader, "TOP_KEYS_EXACT_UP_TO", 100)
    counts = MapState("big", "big_counts", "transactional", keys={"k": "bigint"}).create(engine)
    scans = []
    real_top = MapState.top
    monkeypatch.setattr(MapState, "top", lambda self, c, k: scans.append(1) or real_top(self, c, k))
    clock = [1000.0]
    monkeypatch.setattr(reader.time, "monotonic", lambda: clock[0])

    def commit(txid, rows):
        with engine.begin() as conn:
            counts.stage(conn, txid, 1, rows)
            counts.apply(conn, txid, 1)
        return reader.state_summaries(engine, "big", txid)[0]

    s = commit(1, [(k, k % 7) for k in range(500)])
    assert (s["keys"], len(scans)) == (500, 1)
    s = commit(2, [(1000, 50)])  # a new top key, 10 s later: count and sum follow, top keys wait
    clock[0] += 10
    s = commit(3, [(1001, 1)])
    assert (s["keys"], s["sum"]) == (502, sum(k % 7 for k in range(500)) + 51)
    assert len(scans) == 1 and s["top"][0]["value"] == 6
    clock[0] += reader.TOP_KEYS_REFRESH_S
    s = commit(4, [(1002, 1)])
    assert len(scans) == 2 and s["top"][0] == {"key": "1000", "value": 50}
