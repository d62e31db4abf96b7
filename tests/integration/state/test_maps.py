"""State helpers on a real Postgres: Trident's worked examples, replays, and the error cases."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_txn_provider.rules.exceptions import (
    StagedOutputMismatchError,
    StateAheadOfLogError,
    StateDefinitionError,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import (
    BucketCountState,
    GlobalState,
    MapState,
    load_states,
    stage_states,
)
from airflow_txn_provider.transactions.commit import commit_states


def seed(conn, state, rows):
    cols = list(rows[0])
    for row in rows:
        conn.execute(
            text(
                f"INSERT INTO {state.table} ({', '.join(cols)}) VALUES "
                f"({', '.join(':' + c for c in cols)})"
            ),
            row,
        )


def test_trident_transactional_man_dog_apple(engine):
    """trident-state: txid 3 = [man, man, dog] over man=[3,txid 1], dog=[4,txid 3], apple=[10,2]."""
    counts = MapState("p", "counts", "transactional", keys={"word": "text"}).create(engine)
    with engine.begin() as conn:
        seed(
            conn,
            counts,
            [
                {"word": "man", "value": 3, "txid": 1},
                {"word": "dog", "value": 4, "txid": 3},
                {"word": "apple", "value": 10, "txid": 2},
            ],
        )
        counts.stage(conn, 3, 1, [("man", 1), ("man", 1), ("dog", 1)])
        result = counts.apply(conn, 3, 1)
        assert (result.staged_rows, result.keys) == (3, 2)
        assert counts.rows(conn) == [
            {"word": "apple", "value": 10, "txid": 2},
            {"word": "dog", "value": 4, "txid": 3},  # already holds txid 3: skipped
            {"word": "man", "value": 5, "txid": 3},
        ]


@pytest.mark.parametrize(
    ("current_txid", "expected"),
    [
        (3, {"value": 6, "prev_value": 4, "txid": 3}),  # new txid: prev := value, value += 2
        (2, {"value": 3, "prev_value": 1, "txid": 2}),  # same txid: value := prev + 2
    ],
)
def test_trident_opaque_example(engine, current_txid, expected):
    """trident-state: stored {value=4, prevValue=1, txid=2}, partial count 2."""
    count = GlobalState("p", "count", "opaque").create(engine)
    with engine.begin() as conn:
        seed(conn, count, [{"value": 4, "prev_value": 1, "txid": 2}])
        count.stage_value(conn, current_txid, 1, 2)
        count.apply(conn, current_txid, 1)
        assert count.rows(conn) == [{"singleton": True, **expected}]


@pytest.mark.parametrize("kind", ["transactional", "opaque"])
def test_stored_txid_ahead_of_current_is_an_error(engine, kind):
    words = MapState("p", "w", kind, keys={"word": "text"}).create(engine)
    with engine.begin() as conn:
        seed(conn, words, [{"word": "man", "value": 3, "txid": 5}])
    with (
        pytest.raises(StateAheadOfLogError, match="newest stored txid 5") as err,
        engine.begin() as conn,
    ):
        words.stage(conn, 4, 2, [("man", 1), ("dog", 1)])
        words.apply(conn, 4, 2)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 4, 2)
    with engine.connect() as conn:  # the whole batch was rolled back, dog included
        assert words.items(conn) == {("man",): 3}


def test_non_transactional_adds_every_time(engine):
    hits = MapState("p", "hits", "non_transactional", keys={"page": "text"}).create(engine)
    with engine.begin() as conn:
        for txid in (1, 1, 2):
            hits.stage(conn, txid, 1, [("home", 2)])
            hits.apply(conn, txid, 1)
        assert hits.items(conn) == {("home",): 6}


def test_multi_column_keys_and_combiners(engine):
    peak = MapState(
        "p",
        "peak",
        "opaque",
        keys={"day": "date", "host": "text"},
        value_type="double precision",
        combiner="max",
    ).create(engine)
    with engine.begin() as conn:
        peak.stage(
            conn,
            1,
            1,
            [("2026-01-01", "a", 1.5), ("2026-01-01", "a", 7.0), ("2026-01-02", "b", 2.0)],
        )
        peak.apply(conn, 1, 1)
        peak.stage(conn, 2, 1, [("2026-01-01", "a", 3.0), ("2026-01-02", "b", 9.5)])
        peak.apply(conn, 2, 1)
        got = {(str(d), h): v for (d, h), v in peak.items(conn).items()}
        assert got == {("2026-01-01", "a"): 7.0, ("2026-01-02", "b"): 9.5}
        import datetime

        assert peak.get(
            conn, [(datetime.date(2026, 1, 2), "b"), (datetime.date(2027, 1, 1), "z")]
        ) == {(datetime.date(2026, 1, 2), "b"): 9.5}


def test_definitions_are_checked(engine):
    MapState("p", "words", "transactional", keys={"word": "text"}).create(engine)
    with pytest.raises(StateDefinitionError, match="declared as"):
        MapState("p", "words", "opaque", keys={"word": "text"}).create(engine)
    with pytest.raises(StateDefinitionError):
        MapState("other", "words", "transactional", keys={"word": "text"}).create(engine)
    for bad in (
        dict(name="Bad-Name"),
        dict(name="w", keys={"value": "text"}),
        dict(name="w", keys={"w": "text; DROP TABLE x"}),
        dict(name="w", value_type="text"),
        dict(name="w", combiner="avg"),
        dict(name="w", kind="exactly_once"),
    ):
        with pytest.raises(ValueError):
            MapState(**{"pipeline": "p", **bad})
    words = MapState("p", "words", "transactional", keys={"word": "text"})
    with pytest.raises(ValueError, match="2 values"), engine.begin() as conn:
        words.stage(conn, 1, 1, [("a", 1, 2)])


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"batch": txid} if txid in BATCHES else None


BATCHES = {
    1: ["the", "cow", "jumped", "over", "the", "moon"],
    2: ["the", "man", "went", "to", "the", "store"],
    3: ["four", "score", "and", "seven", "years", "ago"],
}


def run_words_pipeline(txlog, name, replays):
    """Storm's TransactionalWords: counts per word and per count-bucket, one commit for both.

    ``replays`` txids have their first attempt fail after processing (and so the later ones too).
    """
    words = MapState(name, f"{name}_words", "transactional", keys={"word": "text"}).create(
        txlog.engine
    )
    total = GlobalState(name, f"{name}_total", "opaque").create(txlog.engine)
    buckets = BucketCountState(name, f"{name}_buckets", of=f"{name}_words", bucket_size=2)
    buckets.create(txlog.engine)
    states = [words, total, buckets]
    txlog.register_pipeline(name, source_kind="transactional", max_pending=3)
    src = Batches()
    failed_once = set()
    while txlog.last_committed(name) < len(BATCHES):
        em = txlog.begin_next(name, src)
        if em is None or not em.emitted:
            nxt = txlog.last_committed(name) + 1
            attempt = txlog.view(name).record(nxt).attempt
            commit_states(txlog, name, nxt, attempt, states)
            continue
        batch = BATCHES[em.metadata["batch"]]
        counts = {}
        for w in batch:
            counts[w] = counts.get(w, 0) + 1
        txlog.stage_output(
            name,
            em.txid,
            em.attempt,
            lambda conn, em=em, counts=counts, batch=batch: stage_states(
                conn, em.txid, em.attempt, {words: counts.items(), total: [(len(batch),)]}
            ),
        )
        if em.txid in replays and em.txid not in failed_once:
            failed_once.add(em.txid)
            txlog.fail(name, em.txid, em.attempt, error="injected")
    with txlog.engine.connect() as conn:
        return words.items(conn), total.value(conn), buckets.items(conn)


def test_replaying_whole_batches_gives_identical_state(txlog):
    clean = run_words_pipeline(txlog, "clean", replays=set())
    replayed = run_words_pipeline(txlog, "replayed", replays={1, 2, 3})
    assert clean == replayed
    expected = {}
    for batch in BATCHES.values():
        for w in batch:
            expected[(w,)] = expected.get((w,), 0) + 1
    buckets = {}
    for count in expected.values():  # bucket_size 2: counts 0-1 in bucket 0, 2-3 in bucket 1
        buckets[(count // 2,)] = buckets.get((count // 2,), 0) + 1
    assert clean[:2] == (expected, 18)
    # Words that moved bucket left theirs: empty buckets stay as 0, never go negative.
    assert {k: v for k, v in clean[2].items() if v} == buckets
    assert min(clean[2].values()) == 0
    assert max(a.attempt for a in txlog.attempts("replayed", 3)) >= 2


def test_bucket_counts_follow_words_across_buckets(txlog):
    """Storm's TransactionalWords: a word moving bucket leaves the old one in the same commit."""
    words = MapState("b", "b_words", "transactional", keys={"word": "text"}).create(txlog.engine)
    buckets = BucketCountState("b", "b_buckets", of="b_words", bucket_size=3).create(txlog.engine)
    txlog.register_pipeline("b", source_kind="transactional", max_pending=2)
    src = Batches()
    steps = [[("a", 2), ("b", 1)], [("a", 1), ("c", 5)], [("b", 1)]]
    seen = []
    for txid, rows in enumerate(steps, 1):
        txlog.begin("b", txid, src)
        txlog.stage_output(
            "b", txid, 1, lambda c, t=txid, r=rows: stage_states(c, t, 1, {words: r})
        )
        commit_states(txlog, "b", txid, 1, [words, buckets])
        with txlog.engine.connect() as conn:
            seen.append({k[0]: v for k, v in buckets.items(conn).items() if v})
    # 1: a=2, b=1 -> bucket 0 holds 2.  2: a=3 (bucket 1), c=5 (bucket 1).  3: b=2 (bucket 0).
    assert seen == [{0: 2}, {0: 1, 1: 2}, {0: 1, 1: 2}]
    loaded = load_states(txlog.engine, "b")["b_buckets"]
    assert isinstance(loaded, BucketCountState)
    assert (loaded.of, loaded.bucket_size) == ("b_words", 3)


def test_bucket_state_needs_its_source_in_the_commit(txlog):
    MapState("q", "q_words", "transactional", keys={"word": "text"}).create(txlog.engine)
    buckets = BucketCountState("q", "q_buckets", of="q_words").create(txlog.engine)
    txlog.register_pipeline("q", source_kind="transactional", max_pending=2)
    with pytest.raises(StateDefinitionError, match="derived from 'q_words'"):
        commit_states(txlog, "q", 1, 1, [buckets])
    with pytest.raises(StateDefinitionError, match="exists as"):
        BucketCountState("q", "q_buckets", of="q_words", bucket_size=5).create(txlog.engine)
    with pytest.raises(ValueError, match="bucket_size"):
        BucketCountState("q", "x", of="q_words", bucket_size=0)


def test_lost_staging_fails_the_commit_instead_of_committing_nothing(txlog):
    words = MapState("p", "lost", "transactional", keys={"word": "text"}).create(txlog.engine)
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    txlog.begin("p", 1, Batches())
    txlog.stage_output("p", 1, 1, lambda c: {words.output_key: words.stage(c, 1, 1, [("a", 1)])})
    with txlog.engine.begin() as conn:  # what a Postgres crash does to an UNLOGGED table
        conn.execute(text(f"TRUNCATE {words.stage_table}"))
    with pytest.raises(StagedOutputMismatchError, match="0 staged rows found") as err:
        commit_states(txlog, "p", 1, 1, [words])
    assert (err.value.txid, err.value.attempt) == (1, 1)
    assert txlog.view("p").record(1).status.value == "failed"  # replays, nothing lost
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {}


def test_bucket_counts_of_a_double_precision_state(txlog):
    sums = MapState(
        "d", "d_sums", "transactional", keys={"k": "text"}, value_type="double precision"
    )
    sums.create(txlog.engine)
    buckets = BucketCountState("d", "d_buckets", of="d_sums", bucket_size=2).create(txlog.engine)
    txlog.register_pipeline("d", source_kind="transactional", max_pending=2)
    txlog.begin("d", 1, Batches())
    txlog.stage_output(
        "d", 1, 1, lambda c: stage_states(c, 1, 1, {sums: [("a", 2.5), ("b", -0.5)]})
    )
    commit_states(txlog, "d", 1, 1, [sums, buckets])
    with txlog.engine.connect() as conn:
        # floor(2.5 / 2) = 1 and floor(-0.5 / 2) = -1: value // bucket_size, as documented
        assert buckets.items(conn) == {(1,): 1, (-1,): 1}
