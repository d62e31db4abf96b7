"""Rewind to txid N on a real Postgres: every state restored exactly as it was after N - 1 (rows,
bookkeeping columns and summaries), the txids from N recomputed through the normal path with a
changed transform, stale attempts fenced, the floor retention leaves, and the record of who did it.

Ground truth is computed in plain Python beside the pipeline: a txid's batch is a function of its
source metadata (an offset range), and the transform of a batch is "old" before N and "new" from
N on. Seeds are printed.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from sqlalchemy import text

from airflow_txn_provider.rules.exceptions import (
    RewindAheadError,
    RewindTooFarError,
    StaleAttemptError,
)
from airflow_txn_provider.rules.history import REWOUND_BY
from airflow_txn_provider.rules.sources import OpaqueSource, TransactionalSource
from airflow_txn_provider.rules.vocabulary import ProcessedAction, TxStatus
from airflow_txn_provider.state import (
    BucketCountState,
    GlobalState,
    MapState,
    load_states,
    stage_states,
)
from airflow_txn_provider.state.summary import read_summary
from airflow_txn_provider.transactions.commit import commit_registered

pytestmark = pytest.mark.integration

WORDS = [f"w{i:02d}" for i in range(40)]
STEP = 6


def records(start: int, end: int) -> list[str]:
    """The source's records ``[start, end)``: record ``n`` is a word drawn from ``n`` alone."""
    return [random.Random(n).choice(WORDS) for n in range(start, end)]


class Ranges(TransactionalSource):
    """Each txid takes the next ``STEP`` records; a replay reads the same range."""

    def initialize_transaction(self, txid, prev_metadata):
        start = prev_metadata["end"] if prev_metadata else 0
        return {"start": start, "end": start + STEP}


class GrowingRanges(OpaqueSource):
    """An opaque source whose next range grows each time it is asked (more records arrived):
    a replay starts where the previous txid ended and may take more."""

    def __init__(self) -> None:
        self.asked = 0

    def initialize_transaction(self, txid, prev_metadata):
        self.asked += 1
        start = prev_metadata["end"] if prev_metadata else 0
        return {"start": start, "end": start + STEP + self.asked % 3}


def old_transform(batch: list[str]) -> Counter[str]:
    return Counter(batch)


def new_transform(batch: list[str]) -> Counter[str]:
    """The fixed job: counts upper-cased words, each twice (any change the old one did not do)."""
    return Counter({w.upper(): 2 * n for w, n in Counter(batch).items()})


def declare(txlog, name, source_kind, **kw):
    """A pipeline with one state of each kind, a global one, and a bucket count derived at
    commit time."""
    engine = txlog.engine
    txlog.register_pipeline(name, source_kind=source_kind, max_pending=4, **kw)
    states = [
        MapState(name, f"{name}_tx", "transactional", keys={"word": "text"}),
        MapState(name, f"{name}_op", "opaque", keys={"word": "text"}),
        MapState(name, f"{name}_nt", "non_transactional", keys={"word": "text"}, combiner="max"),
        GlobalState(name, f"{name}_total", "opaque"),
        BucketCountState(name, f"{name}_buckets", of=f"{name}_tx", bucket_size=3),
    ]
    for state in states:
        state.create(engine)
    return states


def run_txid(txlog, name, txid, source, transform, *, commit=True):
    """Begin, stage (the transform's counts into the three keyed states, the batch size into
    the global one) and commit ``txid``; returns its emission."""
    e = txlog.begin(name, txid, source)
    assert e.emitted, e
    counts = transform(records(e.metadata["start"], e.metadata["end"]))
    states = load_states(txlog.engine, name)
    batches = {states[f"{name}_{kind}"]: list(counts.items()) for kind in ("tx", "op", "nt")}
    batches[states[f"{name}_total"]] = [(e.metadata["end"] - e.metadata["start"],)]
    txlog.stage_output(
        name, txid, e.attempt, lambda conn: stage_states(conn, txid, e.attempt, batches)
    )
    if commit:
        assert commit_registered(txlog, name, txid, e.attempt).applied
    return e


def snapshot(txlog, name):
    """Every state's rows, bookkeeping columns included, and every summary."""
    with txlog.engine.connect() as conn:
        states = load_states(conn, name)
        rows = {n: s.rows(conn) for n, s in states.items()}
        summaries = {n: read_summary(conn, n) for n, s in states.items() if s.keys}
    return rows, summaries


def truth(ranges, transform_of):
    """Ground truth of the keyed transactional state: the sum over txids of their transform."""
    total: Counter[str] = Counter()
    for txid, (start, end) in ranges.items():
        total.update(transform_of(txid)(records(start, end)))
    return dict(total)


def tx_counts(txlog, name):
    with txlog.engine.connect() as conn:
        state = load_states(conn, name)[f"{name}_tx"]
        return {k[0]: v for k, v in state.items(conn).items()}


@pytest.mark.parametrize("source_kind", ["transactional", "opaque"])
def test_a_rewind_restores_every_state_as_after_n_minus_1_and_recomputes_with_the_new_job(
    txlog, source_kind
):
    seed = 2901 + (source_kind == "opaque")
    rng = random.Random(seed)
    print(f"seed {seed}")
    name = f"rw_{source_kind[:2]}"
    declare(txlog, name, source_kind)
    source = Ranges() if source_kind == "transactional" else GrowingRanges()
    last = 12
    snapshots = {0: snapshot(txlog, name)}
    ranges = {}
    for txid in range(1, last + 1):
        e = run_txid(txlog, name, txid, source, old_transform)
        ranges[txid] = (e.metadata["start"], e.metadata["end"])
        snapshots[txid] = snapshot(txlog, name)
    attempts = {t: txlog.transaction(name, t).attempt for t in ranges}
    n = rng.randrange(2, last)
    print(f"rewind to txid {n}")

    result = txlog.rewind(name, n, by="test:alice", job_version="word_count v2", reason="bug")
    assert result.to_txid == n and result.last_committed_before == last
    assert result.rewound == tuple(range(n, last + 1))
    # every state, rows and bookkeeping columns and summaries, exactly as after n - 1
    assert snapshot(txlog, name) == snapshots[n - 1]
    assert txlog.last_committed(name) == n - 1
    for txid in range(n, last + 1):
        info = txlog.transaction(name, txid)
        assert info.status is TxStatus.FAILED and info.failed_by == REWOUND_BY
        assert info.committed_at is None and f"rewound to txid {n} by test:alice" in info.last_error
    with txlog.engine.connect() as conn:
        record = conn.execute(text("SELECT * FROM txn_rewind WHERE pipeline = :p"), {"p": name})
        [row] = record.mappings().all()
    assert (row["to_txid"], row["last_committed_txid"], row["rewound_txids"]) == (
        n,
        last,
        last - n + 1,
    )
    assert (row["by"], row["job_version"], row["reason"]) == ("test:alice", "word_count v2", "bug")
    assert row["states"][f"{name}_tx"]["restored"] + row["states"][f"{name}_tx"]["removed"] > 0

    # recomputed through the normal path with the fixed job, each with a new attempt
    for txid in range(n, last + 1):
        e = run_txid(txlog, name, txid, source, new_transform)
        assert e.attempt == attempts[txid] + 1
        if source_kind == "transactional":
            assert (e.metadata["start"], e.metadata["end"]) == ranges[txid]  # the same batch
        else:  # from where the txid before ended, maybe further
            assert e.metadata["start"] == ranges[txid - 1][1]  # n >= 2: txid - 1 committed
        ranges[txid] = (e.metadata["start"], e.metadata["end"])
    expected = truth(ranges, lambda t: old_transform if t < n else new_transform)
    assert tx_counts(txlog, name) == expected
    with txlog.engine.connect() as conn:
        states = load_states(conn, name)
        assert {k[0]: v for k, v in states[f"{name}_op"].items(conn).items()} == expected
        assert states[f"{name}_total"].value(conn) == sum(e - s for s, e in ranges.values())
        buckets = Counter(v // 3 for v in expected.values())
        got = {k[0]: v for k, v in states[f"{name}_buckets"].items(conn).items() if v}
        assert got == dict(buckets)
        assert read_summary(conn, f"{name}_tx") == (len(expected), sum(expected.values()))


def test_a_rewind_fences_attempts_in_flight_and_can_go_again_and_to_txid_1(txlog):
    name = "rw_fence"
    declare(txlog, name, "transactional")
    source = Ranges()
    for txid in range(1, 7):
        run_txid(txlog, name, txid, source, old_transform)
    processed = run_txid(txlog, name, 7, source, old_transform, commit=False)  # waits to commit
    processing = txlog.begin(name, 8, source)  # its job still running
    before_4 = None

    txlog.rewind(name, 4, by="test:bob")
    # the stale attempts can neither commit nor record their output
    with pytest.raises(StaleAttemptError):
        commit_registered(txlog, name, 7, processed.attempt)
    assert txlog.mark_processed(name, 8, processing.attempt, {}) is ProcessedAction.IGNORE_STALE
    assert txlog.last_committed(name) == 3
    for txid in range(4, 9):
        e = run_txid(txlog, name, txid, source, new_transform)
        if txid == 4:
            before_4 = e
    assert before_4.attempt == 2
    ranges = {t: ((t - 1) * STEP, t * STEP) for t in range(1, 9)}
    assert tx_counts(txlog, name) == truth(
        ranges, lambda t: old_transform if t < 4 else new_transform
    )

    # again, further back, then to the first txid: every state empty, every key gone
    txlog.rewind(name, 2, by="test:bob")
    assert tx_counts(txlog, name) == truth({1: ranges[1]}, lambda t: old_transform)
    txlog.rewind(name, 1, by="test:bob")
    rows, summaries = snapshot(txlog, name)
    assert all(r == [] for r in rows.values()) and all(s == (0, 0) for s in summaries.values())
    for txid in range(1, 9):
        run_txid(txlog, name, txid, source, new_transform)
    assert tx_counts(txlog, name) == truth(ranges, lambda t: new_transform)
    # one new attempt per replay: txid 4 was replayed after each of the rewinds that reached it
    # and recomputed in between once; txid 1 only after the last
    assert txlog.transaction(name, 4).attempt == 3
    assert txlog.transaction(name, 1).attempt == 2


def test_the_floor_follows_retention_and_the_version_that_wrote_no_undo_records(txlog, engine):
    name = "rw_floor"
    declare(txlog, name, "transactional", keep_txids=3)
    source = Ranges()
    for txid in range(1, 41):
        run_txid(txlog, name, txid, source, old_transform)
    txlog.prune(name)
    pruned = txlog.retention(name).pruned_through_txid
    assert pruned >= 30
    with pytest.raises(RewindTooFarError) as raised:
        txlog.rewind(name, pruned + 1, by="test")
    assert raised.value.floor == str(pruned + 2)
    before = snapshot(txlog, name)
    with pytest.raises(RewindAheadError):
        txlog.rewind(name, 42, by="test")
    assert snapshot(txlog, name) == before  # a refused rewind changes nothing
    # the undo records of pruned txids went with them
    with engine.connect() as conn:
        oldest = conn.execute(text(f'SELECT min(txid) FROM "txn_undo_{name}_tx"')).scalar_one()
    assert oldest == pruned + 1
    # as if the txids before pruned + 3 were committed by a version without undo records
    undo_from = "UPDATE txn_pipeline SET undo_from_txid = :t WHERE name = :p"
    with engine.begin() as conn:
        conn.execute(text(undo_from), {"t": pruned + 3, "p": name})
    with pytest.raises(RewindTooFarError, match=f"restore exactly is {pruned + 3}"):
        txlog.rewind(name, pruned + 2, by="test")
    with engine.begin() as conn:
        conn.execute(text(undo_from), {"t": 1, "p": name})

    txlog.rewind(name, pruned + 2, by="test")  # the floor itself: exact
    ranges = {t: ((t - 1) * STEP, t * STEP) for t in range(1, pruned + 2)}
    assert tx_counts(txlog, name) == truth(ranges, lambda t: old_transform)


def test_a_rewind_of_more_txids_than_the_window_replays_max_pending_at_a_time(txlog):
    """``max_pending=2``, six txids rewound: ``begin_next`` and ``begin`` of every rewound txid
    start two; the next starts once the oldest commits, until all six are committed again."""
    name = "rw_window"
    txlog.register_pipeline(name, source_kind="transactional", max_pending=2)
    source = Ranges()
    for txid in range(1, 7):
        e = txlog.begin(name, txid, source)
        txlog.stage_output(name, txid, e.attempt, lambda conn: None)
        assert commit_registered(txlog, name, txid, e.attempt).applied
    txlog.rewind(name, 1, by="test:window")

    started = [txlog.begin_next(name, source), txlog.begin_next(name, source)]
    assert [e.txid for e in started] == [1, 2] and all(e.attempt == 2 for e in started)
    assert txlog.begin_next(name, source) is None  # window full
    begins = [txlog.begin(name, txid, source) for txid in range(3, 7)]
    assert not any(e.emitted for e in begins), begins  # each waits for the window or txid - 1
    statuses = [txlog.transaction(name, t).status for t in range(1, 7)]
    assert statuses.count(TxStatus.PROCESSING) == 2, statuses
    for txid in range(1, 7):
        e = txlog.begin(name, txid, source)  # resumes the live one, or replays the next
        assert e.emitted and e.attempt == 2, e
        txlog.stage_output(name, txid, e.attempt, lambda conn: None)
        assert commit_registered(txlog, name, txid, e.attempt).applied
        live = [
            t
            for t in range(txid + 1, 7)
            if txlog.transaction(name, t).status is not TxStatus.FAILED
        ]
        assert len(live) <= 2, live
    assert txlog.last_committed(name) == 6
