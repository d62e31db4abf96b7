"""A state read as of any kept txid (issue 61) on a real Postgres, against ground truth in plain
Python: the fold of the committed batches 1..N, for every kept N and every state kind
(transactional, opaque, non-transactional, a global state, a derived bucket count), over random
histories of commits, failures and replays, rewinds and retention pruning (Hypothesis), and
after a Postgres backend's crash recovery. Older txids are refused with the typed error, which
says how far back a read can go; so is the SQL function a BI tool calls. A key's history and
what a txid changed are checked against the same truth. Seeds are printed.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from airflow_txn_provider.rules.exceptions import (
    StagedOutputMismatchError,
    StateTxidNotReadableError,
)
from airflow_txn_provider.rules.sources import OpaqueSource
from airflow_txn_provider.state import BucketCountState, GlobalState, MapState, stage_states
from airflow_txn_provider.state.as_of import as_of_floor, as_of_function, txid_changes
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from txn_testing.postgres import EmbeddedPostgres

pytestmark = pytest.mark.integration

SEED = 6161
WORDS = [f"w{i}" for i in range(12)]
BUCKET = 4
KEYED = ("tx", "op", "nt")
_names = itertools.count(1)


class Ranges(OpaqueSource):
    """Metadata only: the test stages each attempt's batch itself (a replay may differ)."""

    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def declare(txlog, name: str, keep_txids: int = 1000) -> dict[str, MapState]:
    """A pipeline with one keyed state of each kind (sum), a global one, and a bucket count of
    the transactional one, derived at commit."""
    txlog.register_pipeline(name, source_kind="opaque", max_pending=2, keep_txids=keep_txids)
    states = {
        "tx": MapState(name, f"{name}_tx", "transactional", keys={"word": "text"}),
        "op": MapState(name, f"{name}_op", "opaque", keys={"word": "text"}),
        "nt": MapState(name, f"{name}_nt", "non_transactional", keys={"word": "text"}),
        "total": GlobalState(name, f"{name}_total", "opaque"),
        "buckets": BucketCountState(name, f"{name}_buckets", of=f"{name}_tx", bucket_size=BUCKET),
    }
    for state in states.values():
        state.create(txlog.engine)
    return states


Batch = tuple[list[tuple[str, int]], list[tuple[int]]]
"""A txid's staged rows: ``(word, delta)`` for the keyed states, ``(delta,)`` for the global."""


def random_batch(rng: random.Random) -> Batch:
    rows = [(rng.choice(WORDS), rng.randint(-3, 9)) for _ in range(rng.randint(0, 6))]
    total = [(rng.randint(-5, 20),)] if rng.random() < 0.8 else []
    return rows, total


@dataclass
class Truth:
    """Each state's ground truth after every committed txid, folded in plain Python."""

    after: list[dict[str, dict[tuple, Any]]] = field(
        default_factory=lambda: [{s: {} for s in (*KEYED, "total", "buckets")}]
    )
    touched: list[dict[str, set[tuple]]] = field(default_factory=lambda: [{}])
    attempts: list[int] = field(default_factory=lambda: [0])

    def commit(self, batch: Batch, attempt: int) -> None:
        rows, total = batch
        before = self.after[-1]
        now = {s: dict(v) for s, v in before.items()}
        deltas: Counter[tuple] = Counter()
        for word, delta in rows:
            deltas[(word,)] += delta
        touched: dict[str, set[tuple]] = {s: set(deltas) for s in KEYED}
        moves: Counter[int] = Counter()
        for key, delta in deltas.items():
            old = before["tx"].get(key)
            if old is not None:
                moves[old // BUCKET] -= 1
            new = (old or 0) + delta
            moves[new // BUCKET] += 1
            for s in KEYED:
                now[s][key] = now[s].get(key, 0) + delta
        if total:
            now["total"][(True,)] = now["total"].get((True,), 0) + sum(d for (d,) in total)
            touched["total"] = {(True,)}
        moved = {(b,): d for b, d in moves.items() if d}
        for key, d in moved.items():
            now["buckets"][key] = now["buckets"].get(key, 0) + d
        touched["buckets"] = set(moved)
        self.after.append(now)
        self.touched.append(touched)
        self.attempts.append(attempt)

    def rewind(self, to_txid: int) -> None:
        del self.after[to_txid:], self.touched[to_txid:], self.attempts[to_txid:]

    @property
    def last(self) -> int:
        return len(self.after) - 1


def stage(txlog, name, states, txid, batch: Batch) -> int:
    """Begin ``txid`` (a new attempt) and stage ``batch``; returns the attempt."""
    e = txlog.begin(name, txid, Ranges())
    assert e.emitted, e
    rows, total = batch
    batches = {states[s]: rows for s in KEYED}
    batches[states["total"]] = total
    txlog.stage_output(
        name, txid, e.attempt, lambda conn: stage_states(conn, txid, e.attempt, batches)
    )
    return e.attempt


def commit(txlog, name, states, truth: Truth, batch: Batch) -> None:
    txid = truth.last + 1
    attempt = stage(txlog, name, states, txid, batch)
    assert commit_registered(txlog, name, txid, attempt).applied
    truth.commit(batch, attempt)


def fail_and_replay(txlog, name, states, truth: Truth, first: Batch, replay: Batch) -> None:
    """A txid staged, failed (its batch never committed), then replayed with another batch."""
    txid = truth.last + 1
    attempt = stage(txlog, name, states, txid, first)
    txlog.fail(name, txid, attempt, error="injected")
    commit(txlog, name, states, truth, replay)


def sql_as_of(conn, state: MapState, txid: int) -> dict[tuple, Any]:
    rows = conn.execute(text(f'SELECT * FROM "{as_of_function(state.name)}"(:n)'), {"n": txid})
    return {tuple(r[:-1]): r[-1] for r in rows}


def check_every_txid(txlog, name, states, truth: Truth, *, sql: bool = True) -> None:
    """As of every N from 0 to the last committed txid, each state equals the truth where N is
    kept and is refused (typed, naming the floor) where it is not; beyond the last, refused; a
    key's history and each txid's changes equal the truth's."""
    info = txlog.retention(name)
    floor = as_of_floor(info.pruned_through_txid, info.undo_from_txid)
    assert truth.last == txlog.last_committed(name)
    with txlog.engine.connect() as conn:
        for n in range(truth.last + 2):
            for kind, state in states.items():
                if floor <= n <= truth.last:
                    assert state.as_of(conn, n) == truth.after[n][kind], (kind, n)
                    if sql:
                        assert sql_as_of(conn, state, n) == truth.after[n][kind], (kind, n)
                    continue
                with pytest.raises(StateTxidNotReadableError) as refused:
                    state.as_of(conn, n)
                err = refused.value
                assert (err.pipeline, err.state, err.txid) == (name, state.name, n)
                assert (err.floor, err.last_committed) == (str(floor), str(truth.last))
                if sql:
                    with pytest.raises(DBAPIError, match="cannot read as of txid") as raised:
                        with conn.begin_nested():
                            sql_as_of(conn, state, n)
                    assert raised.value.orig.sqlstate == "22023"
        # given keys: those asked, present then
        if floor <= truth.last:
            n = random.Random(truth.last).randint(floor, truth.last)
            asked = [(w,) for w in WORDS[:5]] + [("absent",)]
            expected = {k: v for k, v in truth.after[n]["tx"].items() if k in asked}
            assert states["tx"].as_of(conn, n, keys=asked) == expected
            assert states["tx"].as_of(conn, n, keys=[]) == {}
            assert states["total"].as_of(conn, n, keys=[]) == {}
            assert states["total"].as_of(conn, n, keys=[(True,)]) == truth.after[n]["total"]
            assert states["total"].value_as_of(conn, n) == truth.after[n]["total"].get((True,))
        check_history(conn, states, truth, floor)
    check_changes(txlog, name, truth, floor)


def check_history(conn, states, truth: Truth, floor: int) -> None:
    """Each kept txid that touched a key, newest first, with its committing attempt and the
    values before and after; bounded by ``limit``."""
    kept = range(max(floor + 1, 1), truth.last + 1)  # txids whose undo records are kept
    for kind, state in states.items():
        keys = {k for t in kept for k in truth.touched[t].get(kind, ())}
        for key in sorted(keys, key=repr)[:4]:
            got = state.history(conn, key)
            expected = [
                (t, truth.attempts[t], truth.after[t - 1][kind].get(key), truth.after[t][kind][key])
                for t in reversed(kept)
                if key in truth.touched[t].get(kind, ())
            ]
            assert [(c.txid, c.attempt, c.before, c.after) for c in got] == expected, (kind, key)
            assert all(c.committed_at is not None for c in got)
            assert state.history(conn, key, limit=1) == got[:1]
        if "word" in state.keys:
            assert state.history(conn, ("never",)) == []


def check_changes(txlog, name, truth: Truth, floor: int) -> None:
    """What each txid changed, per state: its touched keys with before/after, the largest
    absolute change first; refused where the state before it cannot be read."""
    for n in range(truth.last + 2):
        if not floor + 1 <= n <= truth.last:
            with pytest.raises(StateTxidNotReadableError) as refused:
                txid_changes(txlog.engine, name, n)
            assert refused.value.floor == str(floor + 1) and refused.value.txid == n
            continue
        changes = txid_changes(txlog.engine, name, n)
        for kind in (*KEYED, "total", "buckets"):
            got = changes[f"{name}_{kind}"]
            before, after = truth.after[n - 1][kind], truth.after[n][kind]
            expected = {k: (before.get(k), after.get(k)) for k in truth.touched[n].get(kind, ())}
            assert {c.key: (c.before, c.after) for c in got} == expected, (kind, n)
            sizes = [abs((c.after or 0) - (c.before or 0)) for c in got]
            assert sizes == sorted(sizes, reverse=True), (kind, n)
        top = txid_changes(txlog.engine, name, n, limit=1)
        assert all(top[s] == changes[s][:1] for s in changes)


Op = tuple[str, int]


def run_history(
    txlog, name, states, truth: Truth, ops: Iterable[Op], rng: random.Random
) -> Counter[str]:
    """Run ``ops`` on the pipeline and the truth alike; returns what was done (a rewind out of
    reach, or with nothing committed, is skipped)."""
    done: Counter[str] = Counter()
    for op, arg in ops:
        if op == "commit":
            commit(txlog, name, states, truth, random_batch(rng))
        elif op == "fail":
            fail_and_replay(txlog, name, states, truth, random_batch(rng), random_batch(rng))
        elif op == "prune":
            done["pruned txids"] += txlog.prune(name)
            continue
        elif op == "rewind" and truth.last:
            info = txlog.retention(name)
            lowest = info.rewind_floor
            if lowest <= truth.last:
                to = lowest + arg % (truth.last - lowest + 1)
                txlog.rewind(name, to, by="test")
                truth.rewind(to)
            else:
                continue
        else:
            continue
        done[op] += 1
    return done


OPS = st.lists(
    st.tuples(
        st.sampled_from(["commit"] * 4 + ["fail", "prune", "rewind"]),
        st.integers(min_value=0, max_value=50),
    ),
    min_size=6,
    max_size=20,
)


def test_the_truth_model_folds_batches_as_the_states_do():
    truth = Truth()
    truth.commit(([("a", 5), ("a", 2), ("b", -1)], [(3,)]), 1)
    truth.commit(([("a", -7)], []), 2)
    assert truth.after[1]["tx"] == {("a",): 7, ("b",): -1}
    assert truth.after[1]["buckets"] == {(1,): 1, (-1,): 1}
    assert truth.after[2]["buckets"] == {(1,): 0, (0,): 1, (-1,): 1}
    assert truth.touched[2]["buckets"] == {(1,), (0,)} and "total" not in truth.touched[2]
    truth.rewind(2)  # to txid 2: as after txid 1
    assert truth.last == 1 and truth.attempts == [0, 1]


@seed(SEED)
@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example prints
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, keep=st.integers(min_value=1, max_value=5), salt=st.integers(0, 2**16))
def test_as_of_every_kept_txid_is_the_fold_of_the_committed_batches(txlog, ops, keep, salt):
    print(f"seed {SEED} salt {salt} keep_txids {keep} ops {ops}")
    name = f"ao{next(_names)}"
    states = declare(txlog, name, keep_txids=keep)
    truth = Truth()
    rng = random.Random(SEED * 65536 + salt)
    done = run_history(txlog, name, states, truth, ops, rng)
    print(f"  done {dict(done)}, last committed {truth.last}, {txlog.retention(name)}")
    check_every_txid(txlog, name, states, truth)


def test_past_retention_is_refused_naming_how_far_back_and_the_floor_is_the_rewinds(txlog):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    name = "ao_floor"
    states = declare(txlog, name, keep_txids=3)
    truth = Truth()
    for _ in range(40):  # commits prune by themselves every few txids
        commit(txlog, name, states, truth, random_batch(rng))
    txlog.prune(name)
    info = txlog.retention(name)
    assert info.pruned_through_txid >= 30
    floor = as_of_floor(info.pruned_through_txid, info.undo_from_txid)
    assert floor == info.rewind_floor - 1 == info.pruned_through_txid + 1
    with txlog.engine.connect() as conn, pytest.raises(StateTxidNotReadableError) as refused:
        states["op"].as_of(conn, floor - 1)
    assert f"txids {floor} to 40 can be read" in str(refused.value)
    assert f"pipeline={name} txid={floor - 1}" in str(refused.value)
    # as if the txids before floor + 2 were committed by a version without undo records
    undo_from = "UPDATE txn_pipeline SET undo_from_txid = :t WHERE name = :p"
    with txlog.engine.begin() as conn:
        conn.execute(text(undo_from), {"t": floor + 2, "p": name})
    with txlog.engine.connect() as conn:
        with pytest.raises(StateTxidNotReadableError) as refused:
            states["tx"].as_of(conn, floor)
        assert refused.value.floor == str(floor + 1)
        assert states["tx"].as_of(conn, floor + 1) == truth.after[floor + 1]["tx"]
        with pytest.raises(DBAPIError, match=f"txids {floor + 1} to 40 can be read"):
            sql_as_of(conn, states["tx"], floor)


def test_the_sql_function_is_made_once_and_again_for_a_state_that_lacks_it(txlog):
    name = "ao_fn"
    states = declare(txlog, name)
    truth = Truth()
    commit(txlog, name, states, truth, ([("a", 3)], [(1,)]))
    fn = f'"{as_of_function(f"{name}_tx")}"(bigint)'
    made = "SELECT xmin::text FROM pg_proc WHERE oid = to_regprocedure(:f)"
    with txlog.engine.connect() as conn:
        first = conn.execute(text(made), {"f": fn}).scalar_one()
    declare(txlog, name)  # every begin declares: nothing rewritten
    with txlog.engine.begin() as conn:
        assert conn.execute(text(made), {"f": fn}).scalar_one() == first
        conn.execute(text(f"DROP FUNCTION {fn}"))  # a state of an earlier version
    declare(txlog, name)
    with txlog.engine.connect() as conn:
        assert sql_as_of(conn, states["tx"], 1) == {("a",): 3}
        assert sql_as_of(conn, states["total"], 0) == {}
        assert sql_as_of(conn, states["total"], 1) == {(True,): 1}


def test_reads_as_of_a_txid_are_one_snapshot_while_commits_go_on(txlog):
    """A committer thread commits 30 txids while a reader reads the state as of the txid it
    last saw committed, whole, by SQL and through the key filter: every read is exact."""
    rng = random.Random(SEED + 1)
    print(f"seed {SEED + 1}")
    name = "ao_live"
    states = declare(txlog, name)
    truth = Truth()
    batches = [random_batch(rng) for _ in range(30)]
    done = threading.Event()
    errors: list[BaseException] = []

    def committer():
        try:
            for batch in batches:
                commit(txlog, name, states, truth, batch)
        except BaseException as err:  # reported below
            errors.append(err)
        finally:
            done.set()

    thread = threading.Thread(target=committer)
    thread.start()
    reads = 0
    with txlog.engine.connect() as conn:
        while not done.is_set() or reads < 5:
            n = truth.last  # committed: its truth is final
            expected = truth.after[n]
            conn.commit()  # a new snapshot for each read (READ COMMITTED)
            assert states["tx"].as_of(conn, n) == expected["tx"]
            assert sql_as_of(conn, states["buckets"], n) == expected["buckets"]
            keys = [(w,) for w in WORDS[::2]]
            assert states["op"].as_of(conn, n, keys=keys) == {
                k: v for k, v in expected["op"].items() if k in keys
            }
            reads += 1
    thread.join()
    assert not errors, errors
    assert reads >= 5
    check_every_txid(txlog, name, states, truth, sql=False)


def test_as_of_reads_stay_exact_after_a_backends_crash_recovery_between_commits():
    rng = random.Random(SEED + 2)
    print(f"seed {SEED + 2}")
    with EmbeddedPostgres(durable=True) as pg:  # a backend kill resets the whole server
        txlog = TransactionLog(create_engine(pg.url, pool_pre_ping=True))
        name = "ao_crash"
        states = declare(txlog, name, keep_txids=6)
        truth = Truth()
        kills = []
        for i in range(16):
            commit(txlog, name, states, truth, random_batch(rng))
            if i % 5 == 2:  # between commits: every backend reset, crash recovery runs
                kills.append(pg.kill_backend())
                txlog.engine.dispose()
        assert len(kills) == 3
        # killed between the staging and the commit: the staging is lost, the txid replays
        txid = truth.last + 1
        attempt = stage(txlog, name, states, txid, random_batch(rng))
        kills.append(pg.kill_backend())
        with pytest.raises(StagedOutputMismatchError):
            commit_registered(txlog, name, txid, attempt)
        commit(txlog, name, states, truth, random_batch(rng))
        assert truth.attempts[txid] == attempt + 1
        ops = [("fail", 0), ("prune", 0), ("rewind", 7), ("commit", 0)]
        done = run_history(txlog, name, states, truth, ops, rng)
        assert done["rewind"] == 1 and done["pruned txids"] > 0, done
        kills.append(pg.kill_backend())
        txlog.engine.dispose()
        check_every_txid(txlog, name, states, truth)
        txlog.engine.dispose()


def test_keys_of_several_columns_read_as_of_with_their_history_and_changes(txlog):
    """The history finds a key by its first column's positions and checks the others there."""
    name = "ao_multi"
    txlog.register_pipeline(name, source_kind="opaque", max_pending=1)
    state = MapState(name, f"{name}_s", "opaque", keys={"word": "text", "day": "date"})
    state.create(txlog.engine)
    d1, d2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
    batches = [
        [("a", d1, 5), ("a", d2, 1)],
        [("a", d2, 4), ("b", d1, 2)],
        [("a", d1, -5), ("b", d2, 7)],
    ]
    folded: list[dict[tuple, int]] = [{}]
    for txid, rows in enumerate(batches, start=1):
        e = txlog.begin(name, txid, Ranges())
        txlog.stage_output(
            name,
            txid,
            e.attempt,
            lambda c, e=e, t=txid, r=rows: {state.output_key: state.stage(c, t, e.attempt, r)},
        )
        assert commit_registered(txlog, name, txid, e.attempt).applied
        now = dict(folded[-1])
        for word, day, delta in rows:
            now[(word, day)] = now.get((word, day), 0) + delta
        folded.append(now)
    with txlog.engine.connect() as conn:
        for n, expected in enumerate(folded):
            assert state.as_of(conn, n) == expected == sql_as_of(conn, state, n)
            assert state.as_of(conn, n, keys=[("a", d2), ("b", d2)]) == {
                k: v for k, v in expected.items() if k in {("a", d2), ("b", d2)}
            }
        history = [(c.txid, c.before, c.after) for c in state.history(conn, ("a", d2))]
        assert history == [(2, 1, 5), (1, None, 1)]
        assert [(c.txid, c.before, c.after) for c in state.history(conn, ("a", d1))] == [
            (3, 5, 0),
            (1, None, 5),
        ]
        changes = state.changes(conn, 3)
    assert [(c.key, c.before, c.after) for c in changes] == [
        (("b", d2), None, 7),
        (("a", d1), 5, 0),
    ]


def test_both_read_paths_agree_a_hot_key_walked_back_through_every_txid(txlog):
    """A transactional and an opaque state (rows keep their txid: two scans, a history walked
    back through ``old_txid``) and a non-transactional one (no txid: the first later record of
    each key, sorted) fed the same batches read the same past: a hot key changed by every txid,
    others by some; a limit cuts the walk at the newest."""
    name = "ao_paths"
    txlog.register_pipeline(name, source_kind="opaque", max_pending=1)
    kinds = ("transactional", "opaque", "non_transactional")
    states = [MapState(name, f"{name}_{k[:2]}", k, keys={"word": "text"}) for k in kinds]
    for state in states:
        state.create(txlog.engine)
    rng = random.Random(SEED)
    folded: list[dict[tuple, int]] = [{}]
    for txid in range(1, 31):
        rows = [("hot", rng.randint(-3, 9))] + [
            (w, rng.randint(-3, 9)) for w in rng.sample(WORDS, rng.randint(0, 4))
        ]
        e = txlog.begin(name, txid, Ranges())
        txlog.stage_output(
            name,
            txid,
            e.attempt,
            lambda c, e=e, t=txid, r=rows: {
                s.output_key: s.stage(c, t, e.attempt, r) for s in states
            },
        )
        assert commit_registered(txlog, name, txid, e.attempt).applied
        now = dict(folded[-1])
        for word, delta in rows:
            now[(word,)] = now.get((word,), 0) + delta
        folded.append(now)
    with txlog.engine.connect() as conn:
        for n, expected in enumerate(folded):
            for state in states:
                assert state.as_of(conn, n) == expected, (state.kind, n)
                assert state.as_of(conn, n, keys=[("hot",), ("w1",)]) == {
                    k: v for k, v in expected.items() if k in {("hot",), ("w1",)}
                }
        for key in [("hot",), *((w,) for w in WORDS)]:
            got = [
                [(c.txid, c.before, c.after) for c in s.history(conn, key, limit=100)]
                for s in states
            ]
            assert got[0] == got[1] == got[2], key
            if key == ("hot",):
                assert got[0] == [
                    (t, folded[t - 1].get(key), folded[t][key]) for t in range(30, 0, -1)
                ]
            assert [c.txid for c in states[0].history(conn, key, limit=5)] == [
                t for t, _, _ in got[0][:5]
            ]
