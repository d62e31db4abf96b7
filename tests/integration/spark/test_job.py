"""Processing + commit of several txids on real Spark and a real Postgres log.

Three ways to run the same job file (spark_jobs/word_count.py): spark-submit on local[2], the
Spark Connect fast path, and spark-submit against a real standalone master + worker. Each time the
committed state must equal the word counts computed in plain Python from the same records.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from airflow_txn_provider.hooks.spark_submit import group_alive
from airflow_txn_provider.operators.spark_runner import (
    SparkConnectRunner,
    SparkSubmitRunner,
    load_job_module,
)
from airflow_txn_provider.rules.exceptions import MalformedRecordError, ProcessingError
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import (
    lines_in_ranges,
    parquet_dataset,
    random_lines,
    word_counts,
    write_landing_file,
)
from txn_testing.spark import StandaloneCluster

JOBS = Path(__file__).resolve().parents[3] / "spark_jobs"
WORD_COUNT = JOBS / "word_count.py"
FAST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def _words_pipeline(txlog, name, kind="transactional", state_kind="transactional"):
    txlog.register_pipeline(name, source_kind=kind, max_pending=4)
    return MapState(name, f"{name}_words", state_kind, keys={"word": "text"}).create(txlog.engine)


def _committed_counts(txlog, state):
    with txlog.engine.connect() as conn:
        return {k[0]: v for k, v in state.items(conn).items()}


def _parquet(tmp_path, seed=0, per_partition=(90, 60, 40)):
    data = {str(i): random_lines(seed + i, n) for i, n in enumerate(per_partition)}
    return data, PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 25)


def _run_all(txlog, pipeline, source, process, txids):
    """Begin ``txids`` new txids, process them (in any order), then commit them in order."""
    emissions = [txlog.begin_next(pipeline, source) for _ in range(txids)]
    assert all(e is not None and e.emitted for e in emissions)
    for e in reversed(emissions):  # processing order does not matter, commit order does
        process(BatchJob(pipeline, e.txid, e.attempt, source))
    for e in emissions:
        assert commit_registered(txlog, pipeline, e.txid, e.attempt).applied
    return emissions


def _expected(data, emissions):
    lines = []
    for e in emissions:
        lines += lines_in_ranges(data, e.metadata)
    return dict(word_counts(lines))


@pytest.mark.scenario  # make test-scenarios; CI: the spark-submit kill test below
def test_spark_submit_local(txlog, db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL2", "spark://local%5B2%5D?deploy-mode=client")
    data, source = _parquet(tmp_path)
    state = _words_pipeline(txlog, "submit_local")
    runner = SparkSubmitRunner(WORD_COUNT, log_url=db_url, conn_id="spark_local2", conf=FAST_CONF)

    def process(job):
        runner.run(job)
        assert runner.master == "local[2]"

    emissions = _run_all(txlog, "submit_local", source, process, 2)
    assert _committed_counts(txlog, state) == _expected(data, emissions)


def test_spark_connect_fast_path(txlog, tmp_path, connect_server, monkeypatch):
    data, source = _parquet(tmp_path, seed=10)
    # On Spark Connect the batch's completeness is counted while the transform runs: no pass of
    # its own over the batch
    monkeypatch.setattr(
        type(source), "batch_mismatch", lambda *a: pytest.fail("a second pass over the batch")
    )
    state = _words_pipeline(txlog, "connect")
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    emissions = _run_all(txlog, "connect", source, lambda job: runner.run(job, txlog), 4)
    assert _committed_counts(txlog, state) == _expected(data, emissions)
    assert [t.status for t in txlog.transactions("connect")] == [TxStatus.COMMITTED] * 4


def test_spark_connect_through_airflow_connection(txlog, tmp_path, connect_server, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", connect_server.url)
    data, source = _parquet(tmp_path, seed=20, per_partition=(10,))
    state = _words_pipeline(txlog, "connect_conn")
    runner = SparkConnectRunner(WORD_COUNT, conn_id="spark_connect_test")
    assert runner.connection_url().startswith(connect_server.url)
    emissions = _run_all(txlog, "connect_conn", source, lambda job: runner.run(job, txlog), 1)
    assert _committed_counts(txlog, state) == _expected(data, emissions)


@pytest.mark.scenario  # make test-scenarios: a standalone master and worker, ~3 minutes
def test_standalone_master_and_worker(txlog, db_url, tmp_path, monkeypatch):
    data, source = _parquet(tmp_path, seed=30)
    state = _words_pipeline(txlog, "standalone")
    with StandaloneCluster(worker_cores=2, worker_memory="1g", workdir=tmp_path / "spark") as c:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SPARK_CLUSTER",
            json.dumps(
                {"conn_type": "spark", "host": c.master_url, "extra": {"deploy-mode": "client"}}
            ),
        )
        runner = SparkSubmitRunner(
            WORD_COUNT,
            log_url=db_url,
            conn_id="spark_cluster",
            conf={**FAST_CONF, "spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1"},
        )
        emissions = _run_all(txlog, "standalone", source, runner.run, 2)
        assert runner.master == c.master_url
        apps = {a["name"] for a in c.status()["completedapps"]}
    assert {f"txn:standalone:txid-{e.txid:06d}:attempt-{e.attempt}" for e in emissions} <= apps
    assert _committed_counts(txlog, state) == _expected(data, emissions)


def test_transactional_replay_stages_identical_output(txlog, tmp_path, connect_server):
    _, source = _parquet(tmp_path, seed=40)
    state = _words_pipeline(txlog, "replay")
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    first = txlog.begin("replay", 1, source)
    runner.run(BatchJob("replay", 1, first.attempt, source), txlog)
    txlog.fail("replay", 1, first.attempt, error="injected")
    again = txlog.begin("replay", 1, source)
    assert again.attempt == first.attempt + 1 and again.metadata == first.metadata
    runner.run(BatchJob("replay", 1, again.attempt, source), txlog)
    with txlog.engine.connect() as conn:
        staged_first = state.staged(conn, 1, first.attempt)
        staged_again = state.staged(conn, 1, again.attempt)
    assert staged_first and staged_first == staged_again


def test_stale_attempt_stages_nothing(txlog, tmp_path, connect_server):
    _, source = _parquet(tmp_path, seed=50, per_partition=(10,))
    state = _words_pipeline(txlog, "stale")
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    first = txlog.begin("stale", 1, source)
    txlog.fail("stale", 1, first.attempt)
    txlog.begin("stale", 1, source)
    outcome = runner.run(BatchJob("stale", 1, first.attempt, source), txlog)
    assert outcome.status == "stale"
    with txlog.engine.connect() as conn:
        assert state.staged(conn, 1, first.attempt) == []


def test_opaque_replay_after_partition_disappears_is_exact(txlog, tmp_path, connect_server):
    """Storm's opaque case: txid 2 fails, a partition vanishes before its replay, comes back later.

    The replay of txid 2 covers fewer files; txid 3 starts where the replay ended; the partition's
    files are picked up once it returns. Ground truth: every line of every file, counted once.
    """
    root = tmp_path / "landing"
    files: dict[tuple[str, int], list[str]] = {}
    for p_index, partition in enumerate(["a", "b", "c"]):
        for seq in range(4):
            lines = random_lines(100 * p_index + seq, 5)
            files[(partition, seq)] = lines
            write_landing_file(root, partition, seq, lines)
    source = LandingDirectorySource(str(root), max_files_per_partition=1)
    state = _words_pipeline(txlog, "opaque", kind="opaque", state_kind="opaque")
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)

    def process(emission):
        runner.run(BatchJob("opaque", emission.txid, emission.attempt, source), txlog)

    one, two, three = (txlog.begin_next("opaque", source) for _ in range(3))
    for e in (one, two, three):
        process(e)
    assert two.metadata == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    assert txlog.fail("opaque", 2, two.attempt, error="injected") == (2, 3)
    (root / "b").rename(root / ".b-offline")  # partition b is unavailable during the replay
    two_again = txlog.begin("opaque", 2, source)
    assert two_again.metadata == {"a": [1, 2], "b": [1, 1], "c": [1, 2]}
    process(two_again)
    commit_registered(txlog, "opaque", 1, one.attempt)
    commit_registered(txlog, "opaque", 2, two_again.attempt)
    (root / ".b-offline").rename(root / "b")
    while (e := txlog.begin_next("opaque", source)) is not None and e.emitted:
        process(e)
        commit_registered(txlog, "opaque", e.txid, e.attempt)
    assert txlog.last_committed("opaque") >= 5
    truth = word_counts(line for lines in files.values() for line in lines)
    assert _committed_counts(txlog, state) == dict(truth)


def test_malformed_record_is_named_and_commits_nothing(txlog, tmp_path, connect_server):
    root = tmp_path / "landing"
    write_landing_file(root, "a", 0, ["good words"])
    bad_file = write_landing_file(root, "b", 0, ["fine", "also fine"])
    bad_file.write_text(bad_file.read_text() + '{"line": "unterminated\n')
    source = LandingDirectorySource(str(root))
    state = _words_pipeline(txlog, "malformed", kind="opaque", state_kind="opaque")
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    e = txlog.begin_next("malformed", source)
    with pytest.raises(MalformedRecordError) as raised:
        runner.run(BatchJob("malformed", e.txid, e.attempt, source), txlog)
    err = raised.value
    assert (err.pipeline, err.txid, err.attempt) == ("malformed", 1, 1)
    assert err.location == f"{bad_file}:3"
    assert "pipeline=malformed txid=1 attempt=1" in str(err) and str(bad_file) in str(err)
    info = txlog.transaction("malformed", 1)
    assert info.status is TxStatus.FAILED and f"{bad_file}:3" in info.last_error
    with txlog.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {state.stage_table}")).scalar() == 0
    assert _committed_counts(txlog, state) == {}
    assert txlog.last_committed("malformed") == 0


SLOW_JOB = """
import sys, time
from pyspark.sql import functions as F
from airflow_txn_provider.spark.job import run_job

def sleep_long(x):
    time.sleep(600)
    return 1

def transform(batch):
    slow = F.udf(sleep_long, "long")  # created here: a UDF needs an active session
    return batch.select(F.lit("k").alias("word"), slow(F.col("offset")).alias("delta"))

if __name__ == "__main__":
    sys.exit(run_job(None, transform))
"""


def _run_in_thread(fn):
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:  # a status API that is slow to answer: ask again
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _python_workers(pgid):
    """Processes of group ``pgid`` running pyspark's worker daemon."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid and b"pyspark.daemon" in cmdline:
            found.append(proc.name)
    return found


def test_killing_spark_submit_stops_the_whole_application(txlog, db_url, tmp_path):
    _, source = _parquet(tmp_path, seed=60, per_partition=(4,))
    _words_pipeline(txlog, "kill_submit")
    job_file = tmp_path / "slow_job.py"
    job_file.write_text(SLOW_JOB)
    e = txlog.begin_next("kill_submit", source)
    runner = SparkSubmitRunner(job_file, log_url=db_url, conn_id="none_local", conf=FAST_CONF)
    thread, result = _run_in_thread(lambda: runner.run(BatchJob("kill_submit", 1, 1, source)))
    _wait_for(lambda: runner.hook is not None and runner.hook._submit_sp is not None, 30, "submit")
    pgid = runner.hook._submit_sp.pid
    # a JVM and its Python workers start slowly beside a whole suite on two cores: the last
    # clean-clone run waited over 90 s (the kill is what is tested, not how soon they start)
    _wait_for(lambda: _python_workers(pgid), 240, "the job's Python workers to start")
    runner.kill()
    thread.join(30)
    assert not thread.is_alive() and "error" in result  # spark-submit did not exit 0
    assert not group_alive(pgid), "processes of the killed Spark application are still running"
    assert txlog.transaction("kill_submit", e.txid).status is TxStatus.PROCESSING


def test_killing_spark_connect_interrupts_the_job(txlog, tmp_path, connect_server):
    _, source = _parquet(tmp_path, seed=70, per_partition=(4,))
    _words_pipeline(txlog, "kill_connect")
    job_file = tmp_path / "slow_connect_job.py"
    job_file.write_text(SLOW_JOB)
    e = txlog.begin_next("kill_connect", source)
    runner = SparkConnectRunner(load_job_module(job_file).transform, url=connect_server.url)
    thread, result = _run_in_thread(
        lambda: runner.run(BatchJob("kill_connect", 1, 1, source), txlog)
    )
    _wait_for(lambda: connect_server.running_jobs(), 60, "the job to run on the server")
    runner.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), ProcessingError)
    _wait_for(lambda: not connect_server.running_jobs(), 30, "the server's jobs to stop")
    # A stopped run reports no failure: whoever stopped it (Airflow, a lost lease) decides
    assert runner.stopped
    assert txlog.transaction("kill_connect", e.txid).status is TxStatus.PROCESSING


def test_process_batch_refuses_unknown_state(txlog, tmp_path, spark):
    _, source = _parquet(tmp_path, seed=80, per_partition=(5,))
    _words_pipeline(txlog, "unknown_state")
    e = txlog.begin_next("unknown_state", source)
    wc = load_job_module(WORD_COUNT)
    with pytest.raises(Exception, match=r"unknown output\(s\) \['nope'\]"):
        process_batch(
            spark,
            txlog,
            BatchJob("unknown_state", e.txid, e.attempt, source),
            lambda batch: {"nope": wc.transform(batch)},
        )
    assert txlog.transaction("unknown_state", 1).status is TxStatus.FAILED


def test_two_jobs_share_a_txid_then_record_processed(txlog, tmp_path, spark):
    """Several processing jobs per txid: each stages its state with finish=False, the last step
    records the processed output (staged counts), and one commit applies both states."""
    from airflow_txn_provider.state import GlobalState
    from airflow_txn_provider.transactions.commit import record_processed

    data, source = _parquet(tmp_path, seed=90, per_partition=(30, 20))
    words = _words_pipeline(txlog, "two_jobs")
    total = GlobalState("two_jobs", "two_jobs_total").create(txlog.engine)
    wc = load_job_module(WORD_COUNT)
    gc = load_job_module(JOBS / "global_count.py")
    e = txlog.begin_next("two_jobs", source)
    job = BatchJob("two_jobs", e.txid, e.attempt, source, finish=False)
    first = process_batch(spark, txlog, job, lambda b: {words.name: wc.transform(b)})
    second = process_batch(spark, txlog, job, lambda b: {total.name: gc.transform(b)})
    assert (first.status, second.status) == ("staged", "staged")
    assert txlog.transaction("two_jobs", 1).status is TxStatus.PROCESSING
    assert record_processed(txlog, "two_jobs", 1, e.attempt) == "accept"
    output = txlog.transaction("two_jobs", 1).output
    assert output == {**first.staged_rows, **second.staged_rows}
    commit_registered(txlog, "two_jobs", 1, e.attempt)
    lines = lines_in_ranges(data, e.metadata)
    assert _committed_counts(txlog, words) == dict(word_counts(lines))
    with txlog.engine.connect() as conn:
        assert total.value(conn) == len(lines)
