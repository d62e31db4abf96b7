"""The audit before publish on a real Airflow (issue 60): scheduler, dag-processor, triggerer and
api-server on a Postgres metadata DB, a Spark Connect server, the log in Postgres, all on
127.0.0.1, started here.

A word-count pipeline (max_pending=4, 8 txids of 20 lines) with two expectations: rows for "dog"
and "man" are dropped to the quarantine; a ``Check`` fails a txid whose batch has the word named
in a file (a rule a person can change without redeploying). The file names "apple" from the
start: the first txid whose lines hold it stops the pipeline at once (one attempt, no replay), its
run's note naming the expectation; nothing after it commits. The rule is then lifted (the file
removed) and the run cleared with the UI's REST call: that txid and every later one commit, in
order. Ground truth in plain Python: the committed counts are the lines' words less the dropped
ones, and the quarantine holds exactly each txid's dropped words, once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_txn_provider.log.expectations import quarantined
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import new_database, wait_until
from tests.spark_data import parquet_dataset, random_lines, word_counts
from txn_testing.airflow import AirflowStack, txn_log_connection_env

DAGS = Path(__file__).resolve().parents[2] / "dags"
PIPELINE = "audited_words"
TXIDS, BATCH, SEED = 8, 20, 2060
DROPPED = ("dog", "man")

pytestmark = pytest.mark.scenario  # make test-scenarios (~4 min)


@pytest.fixture
def stack(postgres, db_url, connect_server, tmp_path):
    print(f"seed {SEED}")
    meta = new_database(postgres, migrated=False)
    lines = random_lines(SEED, TXIDS * BATCH)
    banned = tmp_path / "banned-word"
    banned.write_text("apple")
    env = {
        "TXN_TEST_PIPELINE": PIPELINE,
        "TXN_TEST_DATA": str(parquet_dataset(tmp_path / "data", {"0": lines})),
        "TXN_TEST_BATCH": str(BATCH),
        "TXN_TEST_MAX_PENDING": "4",
        "TXN_TEST_BANNED_FILE": str(banned),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_server.url,
        **txn_log_connection_env("txn_log_default", db_url),
    }
    airflow = AirflowStack(tmp_path / "airflow", meta, DAGS, env=env)
    try:
        airflow.start()
        yield airflow, lines, banned
    finally:
        airflow.stop()


def test_a_failed_expectation_stops_at_its_txid_and_a_clear_after_the_fix_commits_exactly(
    stack, db_url
):
    airflow, lines, banned = stack
    batches = {t: lines[BATCH * (t - 1) : BATCH * t] for t in range(1, TXIDS + 1)}
    stop = next(t for t, b in batches.items() if "apple" in word_counts(b))
    run_id = f"txid-{stop:06d}"
    print(f"txid {stop} is the first whose lines hold the banned word")
    api = airflow.client()
    api.wait_for_dag(PIPELINE)
    api.unpause(PIPELINE)
    txlog = TransactionLog.from_url(db_url, migrate=False)

    def stopped():
        history = txlog.history(PIPELINE, stop) if txlog.transaction(PIPELINE, stop) else ()
        return history and history[-1].failed_expectation and history

    wait_until(stopped, 600, f"txid {stop} to fail its audit", airflow)
    note = wait_until(
        lambda: next(
            (
                r.get("note")
                for r in api.runs(PIPELINE)
                if r["dag_run_id"] == run_id and r.get("note")
            ),
            None,
        ),
        120,
        "the poison note",
        airflow,
    )
    assert "POISON BATCH" in note and "a fail expectation failed" in note, note
    assert "'no banned word'" in note and "banned word 'apple'" in note, note
    time.sleep(10)  # nothing after it commits, and it is not replayed
    assert txlog.last_committed(PIPELINE) == stop - 1
    assert len(txlog.attempts(PIPELINE, stop)) == 1, "an audit's poison batch was replayed"

    banned.unlink()  # the rule lifted, then Clear on the run (the UI's REST call)
    api.clear_run(PIPELINE, run_id)
    wait_until(lambda: txlog.last_committed(PIPELINE) >= TXIDS, 600, "every txid", airflow)

    infos = txlog.transactions(PIPELINE)[:TXIDS]
    assert [i.metadata for i in infos] == [
        {"0": [BATCH * (t - 1), BATCH * t]} for t in range(1, TXIDS + 1)
    ]
    truth = word_counts(lines)
    state = MapState(PIPELINE, f"{PIPELINE}_counts", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
        held = quarantined(conn, PIPELINE, limit=10_000)
    assert got == {w: n for w, n in truth.items() if w not in DROPPED}
    want = Counter()
    for t, batch in batches.items():
        for w, n in word_counts(batch).items():
            if w in DROPPED:
                want[(t, w)] += n
    assert Counter({(q.txid, q.row["word"]): q.row["delta"] for q in held}) == want
    assert len(held) == len(want)  # once each
    for q in held:  # stamped with the attempt that committed
        assert q.attempt == txlog.transaction(PIPELINE, q.txid).attempt
    first, second = txlog.attempts(PIPELINE, stop)[:2]
    outcomes = {o["expectation"]: o["taken"] for o in first.expectations}
    assert outcomes["no banned word"] == "failed"
    assert {o["expectation"]: o["taken"] for o in second.expectations}["no banned word"] == "passed"
