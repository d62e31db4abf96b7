"""End to end on a real Airflow: scheduler (LocalExecutor), dag-processor, triggerer and api-server
on a Postgres metadata DB, a Spark Connect server, the transaction log in Postgres — all on
127.0.0.1, all started here.

A word-count pipeline with max_pending=4 over 10 txids of data:

* txid 3's processing fails once, 8 s in (the failure-injection Variable): the txids in flight
  after it are failed with it and re-queued by their failure sensors; txid 3 retries and all commit
  in order;
* txid 6 fails on every attempt: after max_attempts=2 its run fails (a poison batch) and the later
  txids wait; the cause is removed and the run is cleared with the REST call the UI's Clear button
  makes; txid 6 and every later txid commit, in order.

The final state equals word counts computed in plain Python from the data: nothing lost, nothing
counted twice.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from airflow_txn_provider.compat.python import fromisoformat
from airflow_txn_provider.state import MapState
from airflow_txn_provider.timetables import txid_logical_date, txid_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import new_database, wait_until
from tests.spark_data import parquet_dataset, random_lines, word_counts
from txn_testing.airflow import AirflowStack, txn_log_connection_env

DAGS = Path(__file__).resolve().parents[2] / "dags"
PIPELINE = "e2e_words"
TXIDS = 10
BATCH = 20
VARIABLE = f"txn_inject_failure__{PIPELINE}"

# make test-scenarios (~3 min); in CI the browser test clears a poison txid from the UI and the
# chaos runs on Airflow re-queue cascades
pytestmark = pytest.mark.scenario


@pytest.fixture
def stack(postgres, db_url, request, tmp_path):
    from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT

    # Spark Connect where the PySpark supports it; spark-submit (local) on 3.5 (make test-matrix)
    # (a JVM per txid: two at a time on two cores, not four)
    spark = (
        {"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": request.getfixturevalue("connect_server").url}
        if SUPPORTS_CONNECT
        else {"TXN_TEST_SPARK": "submit", "TXN_TEST_MAX_PENDING": "2"}
    )
    meta = new_database(postgres, migrated=False)  # Airflow's metadata database
    data = {"0": random_lines(2026, TXIDS * BATCH)}
    env = {
        "TXN_TEST_PIPELINE": PIPELINE,
        "TXN_TEST_DATA": str(parquet_dataset(tmp_path / "data", data)),
        "TXN_TEST_BATCH": str(BATCH),
        "TXN_TEST_MAX_PENDING": "4",
        "TXN_TEST_MAX_ATTEMPTS": "2",
        **txn_log_connection_env("txn_log_default", db_url),
        **spark,
    }
    airflow = AirflowStack(tmp_path / "airflow", meta, DAGS, env=env)
    try:
        airflow.start()
        yield airflow, data["0"]
    finally:
        airflow.stop()
        # the stack is gone: nothing of it may be left running
        assert not airflow.procs


def test_failures_requeue_and_a_ui_clear_replays_in_order(stack, db_url):
    from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT

    airflow, lines = stack
    slow = 1 if SUPPORTS_CONNECT else 3  # spark-submit starts a JVM per attempt (PySpark 3.5)
    api = airflow.client()
    api.wait_for_dag(PIPELINE)
    # txid 3 fails once, late (the later txids are in flight by then); txid 6 on every attempt
    api.set_variable(VARIABLE, "3@8,6:*")
    api.unpause(PIPELINE)
    txlog = TransactionLog.from_url(db_url, migrate=False)

    def run_of(run_id):
        found = [r for r in api.runs(PIPELINE) if r["dag_run_id"] == run_id]
        return found[0] if found else {}

    def run_state(run_id):
        return run_of(run_id).get("state")

    # txid 6 is a poison batch: txids 1..5 committed, its run says why, the later ones wait
    # (an attempt of txid 6 in flight when txid 3 fails is failed with it: that one does not
    # count toward the two, and the poison batch has three attempts)
    def poisoned():
        six = txlog.attempts(PIPELINE, 6)
        own = [a for a in six if a.failed_by == 6]
        return len(own) == 2 and all(a.status.value == "failed" for a in six) and six

    six = wait_until(poisoned, 600 * slow, "txid 6 to fail twice", airflow)
    assert all("injected failure" in (a.error or "") for a in six if a.failed_by == 6)
    assert all(a.failed_by in (3, 6) for a in six) and len(six) in (2, 3)
    note = wait_until(lambda: run_of("txid-000006")["note"], 60, "the poison note", airflow)
    assert "POISON BATCH" in note and "txid=6" in note and "injected failure" in note

    def tasks_of_six():
        return {ti["task_id"]: ti["state"] for ti in api.task_instances(PIPELINE, "txid-000006")}

    # the grid shows where it stopped: a failed processing task, the sensor still watching
    wait_until(lambda: tasks_of_six()["process_word_count"] == "failed", 60, "a red task", airflow)
    # ... it may still be restarting the later runs, then defers again to keep watching
    wait_until(
        lambda: tasks_of_six()["watch_failures"] == "deferred", 60, "the sensor to watch", airflow
    )
    # txid 6 may be poisoned before txid 3's replay (its run restarted by its sensor) commits:
    # wait for 1..5, then check that nothing after the poison batch follows them
    wait_until(
        lambda: txlog.last_committed(PIPELINE) >= 5, 300 * slow, "txids 1..5 to commit", airflow
    )
    time.sleep(5)
    assert txlog.last_committed(PIPELINE) == 5, "a txid after the poison batch committed"
    assert len(txlog.attempts(PIPELINE, 6)) == len(six), "the poison batch was retried"

    # fix the cause, then press Clear on txid 6's run (the UI's REST call)
    api.delete_variable(VARIABLE)
    api.clear_run(PIPELINE, "txid-000006")
    wait_until(
        lambda: txlog.last_committed(PIPELINE) >= TXIDS, 600 * slow, "every txid to commit", airflow
    )

    # -- what the log says happened --------------------------------------------------------------
    infos = txlog.transactions(PIPELINE)[:TXIDS]
    assert [i.txid for i in infos] == list(range(1, TXIDS + 1))
    assert all(i.status.value == "committed" for i in infos)
    committed_at = [i.committed_at for i in infos]
    assert committed_at == sorted(committed_at), "commits out of txid order"
    # transactional source: each txid's batch is its own offset range, none skipped or repeated
    assert [i.metadata for i in infos] == [
        {"0": [BATCH * (t - 1), BATCH * t]} for t in range(1, TXIDS + 1)
    ]

    three = txlog.attempts(PIPELINE, 3)
    assert three[0].failed_by == 3 and "injected failure" in three[0].error
    assert three[-1].status.value == "committed" and len(three) == 2
    # every later txid in flight when an attempt failed on its own was failed with it (re-queued)
    history = {t: txlog.attempts(PIPELINE, t) for t in range(1, TXIDS + 1)}
    own_failures = [a for t, h in history.items() for a in h if a.failed_by == t]
    cascaded = 0
    for failure in own_failures:
        for t in range(failure.txid + 1, TXIDS + 1):
            for a in history[t]:
                if a.started_at < failure.ended_at and (
                    a.ended_at is None or a.ended_at >= failure.ended_at
                ):
                    assert (a.status.value, a.failed_by) == ("failed", failure.txid), a
                    cascaded += 1
    assert cascaded, "no later txid was in flight when a txid failed: the cascade went untested"
    assert len(txlog.attempts(PIPELINE, 6)) == len(six) + 1  # the poisoned, one after the rerun

    # -- the result equals ground truth ------------------------------------------------------------
    state = MapState(PIPELINE, f"{PIPELINE}_counts", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
    assert got == dict(word_counts(lines))

    # -- and Airflow shows every txid run succeeded, in txid order ---------------------------------
    runs = {r["dag_run_id"]: r for r in api.runs(PIPELINE)}
    wait_until(
        lambda: all(run_state(f"txid-{t:06d}") == "success" for t in range(1, TXIDS + 1)),
        120,
        "every txid run to succeed",
        airflow,
    )
    # claims made later runs ahead: from 3.3 through their supervisors (operator_triggered runs,
    # no token or HTTP client of the task's own), below it through the REST API (manual)
    from airflow_txn_provider.compat.airflow import TASKS_CREATE_RUNS

    made_by = [runs[txid_run_id(t)]["run_type"] for t in range(1, TXIDS + 1)]
    assert made_by[0] == "manual", made_by  # the waker's: no claim before it
    assert ("operator_triggered" in made_by) is TASKS_CREATE_RUNS, made_by
    # each txid on its own millisecond, in order (compared as dates: the API drops ".000000")
    logical = [fromisoformat(runs[txid_run_id(t)]["logical_date"]) for t in range(1, TXIDS + 1)]
    assert logical == [txid_logical_date(t) for t in range(1, TXIDS + 1)]
    txlog.engine.dispose()

    # -- every processing task started warm: the scheduler preloaded the Spark Connect client ----
    # A try cleared while it started may end before its first line; the last try of each run ran.
    # (later runs exist too, polling for data that never comes: they claim nothing)
    tries: dict[Path, list[Path]] = {}
    for t in range(1, TXIDS + 1):
        folder = airflow.home / "logs" / f"dag_id={PIPELINE}" / f"run_id={txid_run_id(t)}"
        for f in folder.glob("task_id=process_*/attempt=*"):
            if re.fullmatch(r"attempt=\d+\.log", f.name):  # not the triggers' logs beside them
                tries.setdefault(f.parent, []).append(f)
    assert len(tries) == TXIDS, sorted(tries)
    cold = [f for fs in tries.values() for f in fs if "cold: this task process" in f.read_text()]
    assert not cold, cold
    last = [max(fs, key=lambda f: int(re.sub(r"\D", "", f.name))) for fs in tries.values()]
    not_warm = [
        f for f in last if "warm: the Spark Connect client was preloaded" not in f.read_text()
    ]
    # (spark-submit, on PySpark 3.5, has no client to preload: its tasks say nothing of it)
    assert not not_warm or not SUPPORTS_CONNECT, {str(f): f.read_text()[-2000:] for f in not_warm}

    # -- a txid that commits without failing starts one worker task. Its processing task
    # committed it: the run's commit and watch_failures are skipped, never started; or an
    # earlier txid's commit committed it: they started and ended in the triggerer (their logs
    # are the triggerer's only) ----------------------------------------------------------------
    # (Airflow 3.1 and 3.2 start them on a worker, which defers: compat/airflow.py)
    from airflow_txn_provider.compat.airflow import STARTS_FROM_TRIGGER

    ended_by_processing = 0
    for t in (1, 2):  # committed before txid 3's failure, which fails later txids only
        folder = airflow.home / "logs" / f"dag_id={PIPELINE}" / f"run_id={txid_run_id(t)}"
        states = {ti["task_id"]: ti["state"] for ti in api.task_instances(PIPELINE, txid_run_id(t))}
        if states["commit"] == "skipped":
            # (its trigger may have seen the commit first: it then ended by itself)
            assert states["watch_failures"] in ("skipped", "success"), (t, states)
            assert not list(folder.glob("task_id=commit/*.log")), t
            ended_by_processing += 1
            continue
        for task_id in ("commit", "watch_failures"):
            logs = sorted(f.name for f in folder.glob(f"task_id={task_id}/*.log"))
            in_triggerer = [".log.trigger." in f for f in logs]
            assert logs and all(in_triggerer) is STARTS_FROM_TRIGGER, (t, task_id, logs)
    assert ended_by_processing, "txid 1 committed by its processing task, its run not ended"
