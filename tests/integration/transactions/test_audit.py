"""The audit before a commit (issue 60) on a real Postgres, against ground truth in plain Python
that applies the same rules: committed + quarantined = the batch, exactly, for every state kind;
a failed ``fail`` expectation stops the pipeline at its txid and a fix commits it and the later
txids exactly; lost staging replays instead of being judged; a backend killed during the audit
heals with nothing lost, doubled or half-quarantined; a rewind takes quarantined rows back."""

from __future__ import annotations

import random
import statistics
from collections import Counter

import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider import (
    Check,
    ExpectationsFailedError,
    RowCondition,
    RowCount,
    RowCountWithinSigma,
)
from airflow_txn_provider.log.expectations import quarantined, quarantined_counts
from airflow_txn_provider.rules.exceptions import StagedOutputMismatchError
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import FailureResponse, TxStatus
from airflow_txn_provider.rules.waiting import respond_to_failure
from airflow_txn_provider.state import BucketCountState, GlobalState, MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from txn_testing.postgres import EmbeddedPostgres

SEED = 6060
WORDS = ["apple", "berry", "cherry", "xenon", "xylo", "date", "elder"]


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _batch(rng: random.Random, n: int) -> list[tuple[str, int]]:
    return [(rng.choice(WORDS), rng.randint(-2, 9)) for _ in range(n)]


def _stage(txlog, pipeline, txid, staged):
    """Begin ``txid`` and stage ``{state: rows}``; returns the attempt."""
    attempt = txlog.begin(pipeline, txid, Batches()).attempt
    txlog.stage_output(
        pipeline,
        txid,
        attempt,
        lambda c: {s.output_key: s.stage(c, txid, attempt, rows) for s, rows in staged.items()},
    )
    return attempt


def _outcomes(txlog, pipeline, txid):
    return {o["expectation"]: o for o in txlog.attempts(pipeline, txid)[-1].expectations}


@pytest.mark.parametrize("kind", ["transactional", "opaque", "non_transactional"])
def test_committed_plus_quarantined_is_the_batch_for_every_state_kind(txlog, kind):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    p = f"audit_{kind}"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=4)
    words = MapState(p, f"{p}_w", kind, keys={"word": "text"}).create(txlog.engine)
    total = GlobalState(p, f"{p}_t", kind).create(txlog.engine)
    buckets = BucketCountState(p, f"{p}_b", of=words.name, bucket_size=5).create(txlog.engine)
    expectations = [
        RowCondition(on=words.name, condition="word NOT LIKE 'x%'", action="drop", name="no x"),
        RowCondition(on=words.name, condition="delta > 0", name="positive"),  # warn
        RowCount(on=words.name, min=1, max=40, action="fail"),
        RowCondition(on=total.name, condition="delta >= 0", action="drop", name="total >= 0"),
        RowCount(on=buckets.name, max=10_000, action="fail"),
    ]
    truth: Counter[str] = Counter()
    truth_total, dropped, by_txid = 0, [], {}
    for txid in range(1, 7):
        rows = _batch(rng, rng.randint(1, 30))
        t = sum(d for _, d in rows) - 10
        attempt = _stage(txlog, p, txid, {words: rows, total: [(t,)]})
        commit_states(txlog, p, txid, attempt, [words, total, buckets], expectations=expectations)
        for w, d in rows:
            if not w.startswith("x"):
                truth[w] += d  # a key whose deltas sum to 0 is stored, with 0
        dropped += [(txid, attempt, w, d) for w, d in rows if w.startswith("x")]
        if t >= 0:
            truth_total += t
        else:
            dropped.append((txid, attempt, "<total>", t))
        by_txid[txid] = (rows, t)
        got = _outcomes(txlog, p, txid)
        n_x = sum(w.startswith("x") for w, _ in rows)
        assert got["no x"]["rows_checked"] == len(rows)  # measured before the drop
        assert got["no x"]["rows_failed"] == n_x
        assert got["no x"]["taken"] == ("dropped" if n_x else "passed")
        assert got["positive"]["rows_failed"] == sum(d <= 0 for _, d in rows)
        assert got["positive"]["taken"] == ("warned" if any(d <= 0 for _, d in rows) else "passed")
        assert got["total >= 0"]["rows_failed"] == (t < 0)
    with txlog.engine.connect() as conn:
        state = {k[0]: v for k, v in words.items(conn).items()}
        assert state == {w: v for w, v in truth.items()}
        assert (total.value(conn) or 0) == truth_total
        counted = Counter()
        for v in state.values():
            counted[v // 5] += 1
        assert {k[0]: v for k, v in buckets.items(conn).items() if v} == dict(counted)
        q = quarantined(conn, p, limit=10_000)
        per_output = Counter(total.name if d[2] == "<total>" else words.name for d in dropped)
        assert quarantined_counts(conn, p) == dict(per_output)
    got_rows = sorted((r.txid, r.attempt, r.row.get("word", "<total>"), r.row["delta"]) for r in q)
    assert got_rows == sorted(dropped)
    assert all(r.expectations in (("no x",), ("total >= 0",)) for r in q)
    # committed + quarantined = the batch, per txid
    for txid, (rows, _t) in by_txid.items():
        mine = [
            (r.row.get("word"), r.row["delta"]) for r in q if r.txid == txid and "word" in r.row
        ]
        assert sorted(mine) == sorted((w, d) for w, d in rows if w.startswith("x"))


def test_a_failed_fail_expectation_stops_at_its_txid_and_a_fix_commits_it_and_the_later(txlog):
    p = "audit_stop"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=4)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    strict = [RowCondition(on=words.name, condition="delta >= 0", action="fail", name="no debt")]
    batches = {1: [("a", 1), ("b", 2)], 2: [("a", 3), ("zed", -4), ("c", 1)], 3: [("b", 5)]}
    attempts = {t: _stage(txlog, p, t, {words: rows}) for t, rows in batches.items()}
    commit_states(txlog, p, 1, attempts[1], [words], expectations=strict)
    with pytest.raises(ExpectationsFailedError) as err:
        commit_states(txlog, p, 2, attempts[2], [words], expectations=strict)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == (p, 2, attempts[2])
    assert "'no debt' on audit_stop_w: 1 of 3 rows fail delta >= 0" in str(err.value)
    assert "sample keys: zed" in str(err.value) and "Clear this txid's run" in str(err.value)
    # the pipeline stops at txid 2 at once (a replay would stage the same rows); 3 waits with it
    assert txlog.transaction(p, 2).status is TxStatus.FAILED
    assert txlog.transaction(p, 3).status is TxStatus.FAILED
    assert txlog.transaction(p, 3).failed_by == 2
    history = txlog.history(p, 2)
    assert history[-1].failed_expectation
    assert respond_to_failure(history, max_attempts=3) is FailureResponse.STOP
    assert _outcomes(txlog, p, 2)["no debt"]["taken"] == "failed"
    assert txlog.last_committed(p) == 1
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("a",): 1, ("b",): 2}  # nothing of txid 2
    # The rule is fixed (debts are allowed, recorded): a Clear reruns 2, then 3 follows.
    fixed = [RowCondition(on=words.name, condition="delta >= 0", action="warn", name="no debt")]
    for txid in (2, 3):
        attempt = _stage(txlog, p, txid, {words: batches[txid]})
        assert commit_states(txlog, p, txid, attempt, [words], expectations=fixed).applied
    assert _outcomes(txlog, p, 2)["no debt"]["taken"] == "warned"
    assert not txlog.history(p, 2)[-1].failed_expectation
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("a",): 4, ("b",): 7, ("zed",): -4, ("c",): 1}


def test_an_expectation_postgres_cannot_evaluate_stops_the_txid_naming_it(txlog):
    p = "audit_bad_rule"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    rules = [
        RowCondition(on=words.name, condition="delta > 0", name="fine"),
        RowCondition(on=words.name, condition="amount >= 0", name="typo"),  # warn only
    ]
    attempt = _stage(txlog, p, 1, {words: [("a", 1)]})
    with pytest.raises(ExpectationsFailedError, match="'typo' on audit_bad_rule_w: cannot be"):
        commit_states(txlog, p, 1, attempt, [words], expectations=rules)
    assert "amount" in _outcomes(txlog, p, 1)["typo"]["message"]
    assert txlog.history(p, 1)[-1].failed_expectation


def test_a_check_gets_the_staged_rows_and_one_that_raises_has_failed(txlog):
    p = "audit_check"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    seen = []

    def distinct_words(rows):
        seen.append(rows)
        return len({r["word"] for r in rows}) == len(rows), f"{len(rows)} rows"

    def broken(rows):
        raise KeyError("amount")

    rules = [
        Check(on=words.name, fn=distinct_words),
        Check(on=words.name, fn=broken, name="broken"),
    ]
    attempt = _stage(txlog, p, 1, {words: [("b", 2), ("a", 1)]})
    commit_states(txlog, p, 1, attempt, [words], expectations=rules)
    assert seen == [[{"word": "a", "delta": 1}, {"word": "b", "delta": 2}]]
    got = _outcomes(txlog, p, 1)
    assert got[rules[0].name]["taken"] == "passed"
    assert got["broken"]["taken"] == "warned" and "KeyError" in got["broken"]["message"]


def test_lost_staging_replays_instead_of_being_judged_on_what_is_left(txlog):
    p = "audit_lost"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    rules = [RowCount(on=words.name, min=2, action="fail")]
    attempt = _stage(txlog, p, 1, {words: [("a", 1), ("b", 1)]})
    with txlog.engine.begin() as conn:  # what a crash recovery does to an UNLOGGED table
        conn.execute(text(f"DELETE FROM {words.backing.qstage}"))
    with pytest.raises(StagedOutputMismatchError, match="0 staged rows found before the audit"):
        commit_states(txlog, p, 1, attempt, [words], expectations=rules)
    history = txlog.history(p, 1)
    assert not history[-1].failed_expectation
    assert respond_to_failure(history, max_attempts=3) is FailureResponse.REQUEUE


def test_a_sigma_bound_judges_against_the_committed_txids_counts(txlog):
    rng = random.Random(SEED)
    p = "audit_sigma"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    bound = RowCountWithinSigma(on=words.name, k=3, last=5, min_history=3, action="fail")
    counts = []
    for txid in range(1, 8):
        n = rng.randint(20, 30)
        attempt = _stage(txlog, p, txid, {words: _batch(rng, n)})
        commit_states(txlog, p, txid, attempt, [words], expectations=[bound])
        taken = _outcomes(txlog, p, txid)[bound.name]["taken"]
        past = counts[-5:]
        if len(past) < 3:
            assert taken == "not_enough_history"
        else:  # the same rule in plain floats (these counts are far from the bound)
            assert abs(n - statistics.mean(past)) <= 3 * statistics.stdev(past)
            assert taken == "passed"
        counts.append(n)
    past = counts[-5:]
    far = int(statistics.mean(past) + 3 * statistics.stdev(past)) + 2
    attempt = _stage(txlog, p, 8, {words: _batch(rng, far)})
    with pytest.raises(ExpectationsFailedError, match=f"{far} rows; the last 5 committed txids"):
        commit_states(txlog, p, 8, attempt, [words], expectations=[bound])


def test_a_rewind_takes_quarantined_rows_back_with_their_txids(txlog):
    p = "audit_rewind"
    txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    rules = [RowCondition(on=words.name, condition="delta > 0", action="drop", name="pos")]
    for txid in (1, 2, 3):
        attempt = _stage(txlog, p, txid, {words: [("a", txid), ("neg", -txid)]})
        commit_states(txlog, p, txid, attempt, [words], expectations=rules)
    result = txlog.rewind(p, 2, by="test")
    assert result.states[words.name]["quarantined_rows_taken_back"] == 2
    with txlog.engine.connect() as conn:
        assert [(r.txid, r.row) for r in quarantined(conn, p)] == [
            (1, {"word": "neg", "delta": -1})
        ]
        assert words.items(conn) == {("a",): 1}
    for txid in (2, 3):  # the replays quarantine again, once
        attempt = _stage(txlog, p, txid, {words: [("a", txid), ("neg", -txid)]})
        commit_states(txlog, p, txid, attempt, [words], expectations=rules)
    with txlog.engine.connect() as conn:
        assert sorted(r.txid for r in quarantined(conn, p)) == [1, 2, 3]
        assert words.items(conn) == {("a",): 6}


def test_a_backend_killed_during_the_audit_heals_with_nothing_lost_doubled_or_half_quarantined():
    with EmbeddedPostgres(durable=True) as pg:  # a backend kill resets the whole server
        txlog = TransactionLog(create_engine(pg.url, pool_pre_ping=True))
        p = "audit_crash"
        txlog.register_pipeline(p, source_kind="transactional", max_pending=2)
        words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
        kills = []

        def crash_once(rows):
            if not kills:  # the commit's transaction is open, its drop not yet made
                kills.append(pg.kill_backend())
            return True, "ok"

        rules = [
            RowCondition(on=words.name, condition="delta > 0", action="drop", name="pos"),
            Check(on=words.name, fn=crash_once),
        ]
        rows = [("a", 2), ("b", -1), ("c", 3), ("d", -5)]
        attempt = _stage(txlog, p, 1, {words: rows})
        # the retried commit finds the UNLOGGED staging emptied: the txid replays, not judged
        with pytest.raises(StagedOutputMismatchError):
            commit_states(txlog, p, 1, attempt, [words], expectations=rules)
        assert kills and txlog.transaction(p, 1).status is TxStatus.FAILED
        again = _stage(txlog, p, 1, {words: rows})
        assert commit_states(txlog, p, 1, again, [words], expectations=rules).applied
        with txlog.engine.connect() as conn:
            assert words.items(conn) == {("a",): 2, ("c",): 3}
            q = quarantined(conn, p)
        assert sorted((r.attempt, r.row["word"]) for r in q) == [(again, "b"), (again, "d")]
        txlog.engine.dispose()
