"""Stateful property-based test of the transaction log on a real Postgres.

Hypothesis drives random begin / begin-next / processed (also late and duplicate) / commit / fail /
failing commit / crash-restart steps, plus source changes (new records, a partition that goes away
and comes back), for max_pending 1..4 and transactional or opaque sources. An independent model in
this file predicts each outcome; a sink table written inside each commit is the ground truth.

Invariants, checked after every step:

* commits are strictly increasing and each txid commits once (sink rows vs. the log);
* no commit without the current attempt's processed output (the sink's attempt was processed and
  was the current one);
* a failure invalidates every later in-flight txid (log statuses equal the model's);
* metadata is initialised in order: the source is only asked for txid k with k-1's current
  metadata, never while k-1 waits for a replay;
* every record offset reaches the sink exactly once, in order: no record skipped or counted twice.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.exceptions import TxnError
from airflow_txn_provider.rules.sources import OpaqueSource, TransactionalSource, next_offset_ranges
from airflow_txn_provider.rules.vocabulary import LeaseRenewal, ProcessedAction, TxStatus
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import new_database

pytestmark = pytest.mark.integration

BATCH = 3
_pipelines = itertools.count(1)


@dataclass
class ModelTx:
    attempt: int
    status: TxStatus
    metadata: dict
    processed_attempt: int | None = None


@pytest.fixture(scope="module")
def model_db(postgres):
    url = new_database(postgres)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE sink (pipeline text, txid bigint, attempt int, part text, "
                "first bigint, stop bigint)"
            )
        )
    engine.dispose()
    return url


class ModelSourceMixin:
    machine: TxnLogMachine

    def initialize_transaction(self, txid, prev_metadata):
        self.machine.on_initialize(txid, prev_metadata)
        return next_offset_ranges(prev_metadata, self.machine.available(), max_per_partition=BATCH)


class ModelTransactional(ModelSourceMixin, TransactionalSource):
    pass


class ModelOpaque(ModelSourceMixin, OpaqueSource):
    pass


class TxnLogMachine(RuleBasedStateMachine):
    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.engine = create_engine(self.url)
        self.log = TransactionLog(self.engine)
        self.pipeline = f"m{next(_pipelines)}"
        self.ready = False
        self.txs: dict[int, ModelTx] = {}
        self.last_committed = 0
        self.handles: set[tuple[int, int]] = set()  # every (txid, attempt) ever emitted
        self.latest = {"a": 20, "b": 12}
        self.b_available = True

    # -- setup -------------------------------------------------------------------------------

    @initialize(
        max_pending=st.integers(1, 4), opaque=st.booleans(), keep=st.sampled_from([1, 2, 1000])
    )
    def setup(self, max_pending, opaque, keep):
        self.max_pending = max_pending
        self.opaque = opaque
        self.source = ModelOpaque() if opaque else ModelTransactional()
        self.source.machine = self
        self.log.register_pipeline(
            self.pipeline, source_kind=self.source.kind, max_pending=max_pending, keep_txids=keep
        )
        self.keep = keep
        self.ready = True

    @precondition(lambda self: self.ready)
    @rule(batch=st.integers(1, 5))
    def prune(self, batch):
        """Retention between any two steps: the rules must never miss what it deleted."""
        pruned = self.log.prune(self.pipeline, batch=batch)
        kept = {t.txid for t in self.log.transactions(self.pipeline)}
        assert {t for t in self.txs if t >= self.last_committed and t >= 1} <= kept
        if pruned:
            event(f"pruned {pruned}")

    # -- source ------------------------------------------------------------------------------

    def available(self):
        return {p: n for p, n in self.latest.items() if p == "a" or self.b_available}

    def on_initialize(self, txid, prev_metadata):
        # Metadata initialised in order: k-1 exists (or k == 1), is not waiting to replay, and
        # prev_metadata is its current metadata.
        if txid == 1:
            assert prev_metadata is None
            return
        prev = self.txs.get(txid - 1)
        assert prev is not None, f"txid {txid} initialised before txid {txid - 1}"
        assert prev.status is not TxStatus.FAILED, (
            f"txid {txid} initialised before {txid - 1} replayed"
        )
        assert prev_metadata == prev.metadata

    @rule(part=st.sampled_from(["a", "b"]), n=st.integers(1, 8))
    def produce(self, part, n):
        self.latest[part] += n

    @rule()
    def toggle_partition_b(self):
        self.b_available = not self.b_available

    # -- transitions -------------------------------------------------------------------------

    def _window(self):
        return range(self.last_committed + 1, self.last_committed + 1 + self.max_pending)

    def _fail_from(self, txid):
        failed = []
        for t in sorted(self.txs):
            if t >= txid and self.txs[t].status in (TxStatus.PROCESSING, TxStatus.PROCESSED):
                self.txs[t].status = TxStatus.FAILED
                failed.append(t)
        return tuple(failed)

    def _record_emission(self, em, expected_invalidated=()):
        assert em.emitted
        assert em.txid in self._window() or em.txid in self.txs, "emitted outside the window"
        assert tuple(em.invalidated) == tuple(expected_invalidated)
        prior = self.txs.get(em.txid)
        assert em.attempt == (prior.attempt + 1 if prior else 1)
        if prior and not self.opaque:
            assert em.metadata == prior.metadata, "transactional replay changed its batch"
        self.txs[em.txid] = ModelTx(em.attempt, TxStatus.PROCESSING, em.metadata)
        self.handles.add((em.txid, em.attempt))

    @precondition(lambda self: self.ready)
    @rule(
        target_kind=st.sampled_from(["new", "new", "new", "oldest_failed", "any"]),
        offset=st.integers(0, 5),
    )
    def begin(self, target_kind, offset):
        failed = [t for t in sorted(self.txs) if self.txs[t].status is TxStatus.FAILED]
        if target_kind == "new":
            txid = max(self.txs, default=0) + 1
        elif target_kind == "oldest_failed" and failed:
            txid = failed[0]
        else:  # anything near the window: re-emissions, waits, committed no-ops
            txid = max(self.last_committed + offset, 1)
        prior = self.txs.get(txid)
        prev = self.txs.get(txid - 1)
        live = (
            prior is not None
            and txid > self.last_committed
            and prior.status in (TxStatus.PROCESSING, TxStatus.PROCESSED)
            and not (prev and prev.status is TxStatus.FAILED)
        )
        em = self.log.begin(self.pipeline, txid, self.source)
        event(f"begin {em.action.value}{' no data' if em.no_data else ''}")
        if live:  # a live attempt (its lease is the claim's, 120 s): handed out again, unchanged
            assert prior is not None
            assert em.resumed and em.attempt == prior.attempt and em.invalidated == ()
            assert em.metadata == prior.metadata
        elif em.emitted:
            self._record_emission(em)
        else:
            self._check_not_emitted(txid, em)

    def _check_not_emitted(self, txid, em):
        action = em.action.value
        if txid <= self.last_committed:
            assert action == "already_committed"
        elif em.no_data:
            pass  # the source had nothing new after txid - 1's batch
        elif action == "wait_window":
            assert txid not in self._window()
        elif action == "wait_previous":
            prev = self.txs.get(txid - 1)
            assert (prev is None and txid > 1) or (prev and prev.status is TxStatus.FAILED)
        else:
            raise AssertionError(f"unexpected begin outcome {em}")

    @precondition(lambda self: self.ready)
    @rule(data=st.data())
    def lease_runs_out(self, data):
        """A processing attempt's process dies: its lease runs out, and expiring it fails it and
        every later txid in flight (an expiry of anything else fails nothing)."""
        candidates = sorted(t for t in self.txs if t > self.last_committed)
        if not candidates:
            return
        txid = data.draw(st.sampled_from(candidates))
        tx = self.txs[txid]
        # The renewal's answer, by the model's status: a finished attempt is done, not lost.
        renewal = {TxStatus.PROCESSING: LeaseRenewal.RENEWED, TxStatus.FAILED: LeaseRenewal.LOST}
        renewed = self.log.renew_lease(self.pipeline, txid, tx.attempt, holder="model", timeout=0)
        assert renewed is renewal.get(tx.status, LeaseRenewal.DONE), (tx, renewed)
        failed = self.log.expire_lease(self.pipeline, txid, tx.attempt)
        event(f"lease expiry of a {tx.status.value} txid")
        if tx.status is not TxStatus.PROCESSING:
            assert failed == ()
            return
        expected = tuple(
            t
            for t in sorted(self.txs)
            if t >= txid and t > self.last_committed and self.txs[t].status is not TxStatus.FAILED
        )
        assert failed == expected
        for t in expected:
            self.txs[t].status = TxStatus.FAILED

    @precondition(lambda self: self.ready)
    @rule()
    def begin_next(self):
        em = self.log.begin_next(self.pipeline, self.source)
        if em is None:
            assert not any(t.status is TxStatus.FAILED for t in self.txs.values())
            assert len(self.txs) - self.last_committed >= self.max_pending
            return
        failed = [t for t in sorted(self.txs) if self.txs[t].status is TxStatus.FAILED]
        if failed:
            assert em.txid == failed[0], "failed txids replay oldest first"
        if em.emitted:
            self._record_emission(em)

    def _current(self, txid, attempt):
        tx = self.txs.get(txid)
        return (
            tx is not None
            and tx.attempt == attempt
            and tx.status in (TxStatus.PROCESSING, TxStatus.PROCESSED)
        )

    @precondition(lambda self: self.ready and self.handles)
    @rule(data=st.data())
    def processed(self, data):
        txid, attempt = data.draw(st.sampled_from(sorted(self.handles)))
        self._processed(txid, attempt)

    def _processed(self, txid, attempt):
        output = {"rows": txid * 100 + attempt}
        action = self.log.mark_processed(self.pipeline, txid, attempt, output)
        if not self._current(txid, attempt):
            assert action is ProcessedAction.IGNORE_STALE
            return
        tx = self.txs[txid]
        if tx.status is TxStatus.PROCESSED:
            assert action is ProcessedAction.DUPLICATE
        else:
            assert action is ProcessedAction.ACCEPT
            tx.status = TxStatus.PROCESSED
            tx.processed_attempt = attempt

    def _live(self):
        return sorted(
            (t, tx.attempt)
            for t, tx in self.txs.items()
            if tx.status in (TxStatus.PROCESSING, TxStatus.PROCESSED)
        )

    @precondition(lambda self: self.ready and self._live())
    @rule(data=st.data())
    def process_live(self, data):
        """The normal path: a live attempt finishes processing."""
        txid, attempt = data.draw(st.sampled_from(self._live()))
        self._processed(txid, attempt)

    @precondition(lambda self: self.ready and (self.last_committed + 1) in self.txs)
    @rule()
    def commit_next(self):
        """The normal path: the oldest uncommitted txid commits with its current attempt."""
        txid = self.last_committed + 1
        self._commit(txid, self.txs[txid].attempt)

    @precondition(
        lambda self: (
            self.ready
            and any(
                t > self.last_committed + 1 and tx.status is TxStatus.PROCESSED
                for t, tx in self.txs.items()
            )
        )
    )
    @rule(data=st.data())
    def commit_ahead(self, data):
        """A processed txid tries to commit before the txids ahead of it."""
        ahead = sorted(
            t
            for t, tx in self.txs.items()
            if t > self.last_committed + 1 and tx.status is TxStatus.PROCESSED
        )
        txid = data.draw(st.sampled_from(ahead))
        self._commit(txid, self.txs[txid].attempt)

    def _sink_apply(self, txid, attempt):
        def apply(conn, record):
            assert record.txid == txid and record.attempt == attempt
            for part, (first, stop) in sorted(record.metadata.items()):
                conn.execute(
                    text("INSERT INTO sink VALUES (:p, :t, :a, :part, :f, :s)"),
                    {
                        "p": self.pipeline,
                        "t": txid,
                        "a": attempt,
                        "part": part,
                        "f": first,
                        "s": stop,
                    },
                )

        return apply

    @precondition(lambda self: self.ready and self.handles)
    @rule(data=st.data())
    def commit(self, data):
        """Any attempt ever emitted tries to commit: stale, early and duplicate commits included."""
        txid, attempt = data.draw(st.sampled_from(sorted(self.handles)))
        self._commit(txid, attempt)

    def _commit(self, txid, attempt):
        may_commit = (
            txid == self.last_committed + 1
            and self._current(txid, attempt)
            and self.txs[txid].status is TxStatus.PROCESSED
        )
        if txid <= self.last_committed:
            result = self.log.commit(self.pipeline, txid, attempt, self._sink_apply(txid, attempt))
            assert not result.applied
            event("commit no-op")
            return
        if not may_commit:
            with pytest.raises(TxnError) as err:
                self.log.commit(self.pipeline, txid, attempt, self._sink_apply(txid, attempt))
            assert (err.value.pipeline, err.value.txid, err.value.attempt) == (
                self.pipeline,
                txid,
                attempt,
            )
            event(f"commit refused: {type(err.value).__name__}")
            return
        result = self.log.commit(self.pipeline, txid, attempt, self._sink_apply(txid, attempt))
        assert result.applied
        event("commit applied")
        self.txs[txid].status = TxStatus.COMMITTED
        self.last_committed = txid

    @precondition(lambda self: self.ready and self.handles)
    @rule(data=st.data())
    def commit_fails(self, data):
        """The commit's state update raises: nothing is kept and the whole txid replays."""
        txid = self.last_committed + 1
        tx = self.txs.get(txid)
        if tx is None or tx.status is not TxStatus.PROCESSED:
            return
        attempt = tx.attempt

        def boom(conn, record):
            self._sink_apply(txid, attempt)(conn, record)
            raise RuntimeError("sink unavailable")

        with pytest.raises(RuntimeError, match="sink unavailable"):
            self.log.commit(self.pipeline, txid, attempt, boom)
        self._fail_from(txid)

    @precondition(lambda self: self.ready and self.handles)
    @rule(data=st.data(), with_attempt=st.booleans())
    def fail(self, data, with_attempt):
        txid, attempt = data.draw(st.sampled_from(sorted(self.handles)))
        failed = self.log.fail(
            self.pipeline, txid, attempt if with_attempt else None, error="injected"
        )
        tx = self.txs[txid]
        if txid <= self.last_committed or (with_attempt and attempt != tx.attempt):
            assert failed == ()
            return
        expected = self._fail_from(txid)
        event(f"fail cascade size {len(expected)}")
        assert failed == expected

    @precondition(lambda self: self.ready)
    @rule()
    def crash_restart(self):
        """Stop everything and start again: a new engine and log, then recovery."""
        self.engine.dispose()
        self.engine = create_engine(self.url)
        self.log = TransactionLog(self.engine)
        processing = [t for t in sorted(self.txs) if self.txs[t].status is TxStatus.PROCESSING]
        expected = self._fail_from(processing[0]) if processing else ()
        assert self.log.recover(self.pipeline) == expected

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def log_matches_model_and_sink_is_exact(self):
        if not self.ready:
            return
        view = self.log.view(self.pipeline)  # raises CorruptLogError if the log broke
        assert view.last_committed == self.last_committed
        for rec in view.in_flight:
            tx = self.txs[rec.txid]
            assert (rec.attempt, rec.status) == (tx.attempt, tx.status), rec.txid
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT txid, attempt, part, first, stop FROM sink WHERE pipeline = :p "
                    "ORDER BY txid, part"
                ),
                {"p": self.pipeline},
            ).all()
        txids = sorted({r.txid for r in rows})
        # Commits strictly increasing from 1 and each txid once (one row per partition per txid).
        assert txids == list(range(1, len(txids) + 1))
        assert len(txids) == self.last_committed  # every batch has at least partition "a"
        pos: dict[str, int] = {}
        for r in rows:
            tx = self.txs[r.txid]
            assert r.attempt == tx.processed_attempt == tx.attempt, "committed a non-current output"
            assert r.first == pos.get(r.part, 0), f"record skipped or repeated at {r}"
            pos[r.part] = r.stop

    def teardown(self):
        self.engine.dispose()


def test_transaction_log_model(model_db):
    TxnLogMachine.url = model_db
    run_state_machine_as_test(
        TxnLogMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
