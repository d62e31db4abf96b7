"""Lake sinks on real components: Spark Connect (local[2]) writes each attempt's Parquet files,
the commit adds them to a real Delta table (delta-rs) or Iceberg table (pyiceberg, SQL catalog
in the test's Postgres), and every table's rows equal word counts computed in plain Python.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.rules.exceptions import (
    LakeSinkError,
    LakeTableOutOfSyncError,
    TxidNotReadableError,
)
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks import DeltaSink, IcebergSink, StagedFiles
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts

WORD_COUNT = Path(__file__).resolve().parents[3] / "spark_jobs" / "word_count.py"


def _sink(kind, tmp_path, name="words", **kw):
    if kind == "delta":
        return DeltaSink(name, table_uri=str(tmp_path / "lake" / name), **kw)
    return IcebergSink(name, table=f"lake.{name}", warehouse=str(tmp_path / "warehouse"), **kw)


def _source(tmp_path, seed=0):
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    data = {str(i): random_lines(seed + i, n) for i, n in enumerate((70, 50))}
    return data, PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 20)


@pytest.fixture
def runner(connect_server):
    return SparkConnectRunner(WORD_COUNT, url=connect_server.url)


def _table_rows(sink, db_url, pipeline, txid=None):
    table = sink.open(db_url)
    version = table.version_as_of(pipeline, txid if txid is not None else 10**9)
    rows = table.read(version).to_pylist()
    return Counter((r["txid"], r["word"], r["delta"]) for r in rows)


def _expected(data, emissions):
    return Counter(
        (e.txid, word, n)
        for e in emissions
        for word, n in word_counts(lines_in_ranges(data, e.metadata)).items()
    )


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_txids_commit_in_order_exactly_once_and_read_as_of(kind, txlog, db_url, tmp_path, runner):
    data, source = _source(tmp_path)
    sink = _sink(kind, tmp_path, txid_column="txid")
    txlog.register_pipeline("lake", source_kind="transactional", max_pending=4)
    emissions = [txlog.begin_next("lake", source) for _ in range(3)]
    for e in reversed(emissions):  # processed in any order, committed in order
        outcome = runner.run(BatchJob("lake", e.txid, e.attempt, source, sinks=(sink,)), txlog)
        assert outcome.status == "processed"
    # Processed but not committed: staged files exist, the table holds nothing yet.
    assert sink.open(db_url).committed_txid("lake") == 0
    for e in emissions:
        assert commit_registered(txlog, "lake", e.txid, e.attempt, [sink]).applied
    assert _table_rows(sink, db_url, "lake") == _expected(data, emissions)
    # As of txid 2: exactly the first two txids' rows.
    assert _table_rows(sink, db_url, "lake", 2) == _expected(data, emissions[:2])
    assert sink.read_as_of("lake", 1, log_url=db_url).num_rows == len(
        _expected(data, emissions[:1])
    )
    with pytest.raises(TxidNotReadableError):
        sink.read_as_of("lake", 0, log_url=db_url)
    table = sink.open(db_url)
    assert table.committed_txid("lake") == 3
    versions = table.versions("lake")
    assert [t for t, _ in versions] == [1, 2, 3]
    # Each txid's record carries its table version (the Transactions page shows it).
    for e, (_, version) in zip(emissions, versions, strict=True):
        commit = txlog.transaction("lake", e.txid).output[sink.output_key]["commit"]
        assert commit["version"] == version and commit["action"] == "add"
    # A rerun of a committed txid adds nothing.
    assert not commit_registered(txlog, "lake", 2, emissions[1].attempt, [sink]).applied
    assert _table_rows(sink, db_url, "lake") == _expected(data, emissions)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_commit_that_crashed_after_the_table_commit_adds_nothing_twice(
    kind, txlog, db_url, tmp_path, runner
):
    data, source = _source(tmp_path, seed=5)
    sink = _sink(kind, tmp_path, txid_column="txid")
    txlog.register_pipeline("crash", source_kind="transactional", max_pending=4)
    e = txlog.begin_next("crash", source)
    runner.run(BatchJob("crash", e.txid, e.attempt, source, sinks=(sink,)), txlog)
    staged = StagedFiles.from_json(txlog.transaction("crash", 1).output[sink.output_key])
    # What a commit that died between the table's commit and the log's leaves behind:
    table = sink.open(db_url)
    first = sink.commit(table, "crash", 1, e.attempt, staged)
    assert first.action == "add"
    assert txlog.transaction("crash", 1).status is TxStatus.PROCESSED
    result = commit_registered(txlog, "crash", 1, e.attempt, [sink])
    assert result.applied
    assert result.details[sink.output_key]["action"] == "already_in_table"
    assert result.details[sink.output_key]["version"] == first.version
    assert _table_rows(sink, db_url, "crash") == _expected(data, [e])


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_failed_attempts_leave_no_files_and_replays_commit_once(
    kind, txlog, db_url, tmp_path, runner
):
    data, source = _source(tmp_path, seed=9)
    sink = _sink(kind, tmp_path, txid_column="txid")
    txlog.register_pipeline("replay", source_kind="transactional", max_pending=4)
    first = txlog.begin_next("replay", source)
    runner.run(BatchJob("replay", 1, first.attempt, source, sinks=(sink,)), txlog)
    failed_dir = txlog.transaction("replay", 1).output[sink.output_key]["directory"]
    txlog.fail("replay", 1, first.attempt, error="lost worker")
    second = txlog.begin("replay", 1, source)
    assert second.attempt == first.attempt + 1
    # The stale attempt's job stages nothing (fenced), the new one commits.
    stale = runner.run(BatchJob("replay", 1, first.attempt, source, sinks=(sink,)), txlog)
    assert stale.status == "stale"
    runner.run(BatchJob("replay", 1, second.attempt, source, sinks=(sink,)), txlog)
    commit_registered(txlog, "replay", 1, second.attempt, [sink])
    assert _table_rows(sink, db_url, "replay") == _expected(data, [second])
    txid_dir = Path(sink.txid_dir("replay", 1))
    kept = txlog.transaction("replay", 1).output[sink.output_key]["directory"]
    assert not Path(failed_dir).exists()
    assert sorted(p.name for p in txid_dir.iterdir()) == [Path(kept).name]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_merge_mode_replaces_rows_by_key(kind, txlog, db_url, tmp_path, runner):
    data, source = _source(tmp_path, seed=13)
    sink = _sink(kind, tmp_path, name="latest", mode="merge", keys=["word"], txid_column="txid")
    txlog.register_pipeline("merge", source_kind="transactional", max_pending=4)
    emissions = [txlog.begin_next("merge", source) for _ in range(3)]
    for e in emissions:
        runner.run(BatchJob("merge", e.txid, e.attempt, source, sinks=(sink,)), txlog)
    for e in emissions:
        commit_registered(txlog, "merge", e.txid, e.attempt, [sink])
    expected: dict[str, tuple[int, int]] = {}
    for e in emissions:  # each txid's count replaces the word's row: the newest batch wins
        for word, n in word_counts(lines_in_ranges(data, e.metadata)).items():
            expected[word] = (e.txid, n)
    table = sink.open(db_url)
    rows = table.read(table.version_as_of("merge", 3)).to_pylist()
    assert {r["word"]: (r["txid"], r["delta"]) for r in rows} == expected
    assert len(rows) == len(expected)
    # Merge leaves no staged files behind: the merge rewrote them.
    assert not any(Path(sink.txid_dir("merge", 2)).glob("*/*.parquet"))


def test_a_table_ahead_of_the_log_is_refused(txlog, db_url, tmp_path, runner):
    _, source = _source(tmp_path, seed=21)
    sink = _sink("delta", tmp_path, txid_column="txid")
    txlog.register_pipeline("ahead", source_kind="transactional", max_pending=4)
    e = txlog.begin_next("ahead", source)
    runner.run(BatchJob("ahead", 1, e.attempt, source, sinks=(sink,)), txlog)
    staged = StagedFiles.from_json(txlog.transaction("ahead", 1).output[sink.output_key])
    table = sink.open(db_url)
    # another log's txids 1 and 7 in the same table (a log reset: its txid 1 was attempt 1 too)
    sink.commit(table, "ahead", 1, e.attempt, staged)
    sink.commit(sink.open(db_url), "ahead", 7, 1, staged)
    table = sink.open(db_url)
    rows = table.read(table.version_as_of("ahead", 7)).num_rows
    with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 7"):
        commit_registered(txlog, "ahead", 1, e.attempt, [sink])
    assert txlog.transaction("ahead", 1).status is TxStatus.FAILED
    assert sink.open(db_url).read(table.version_as_of("ahead", 7)).num_rows == rows
    assert pc.sum(sink.open(db_url).read(table.version_as_of("ahead", 7))["delta"]).as_py() > 0


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_replay_after_a_crashed_commit_replaces_the_failed_attempts_rows(
    kind, txlog, db_url, tmp_path, runner
):
    data, source = _source(tmp_path, seed=25)
    sink = _sink(kind, tmp_path, txid_column="txid")
    txlog.register_pipeline("replayed", source_kind="transactional", max_pending=4)
    first = txlog.begin_next("replayed", source)
    runner.run(BatchJob("replayed", 1, first.attempt, source, sinks=(sink,)), txlog)
    staged = StagedFiles.from_json(txlog.transaction("replayed", 1).output[sink.output_key])
    sink.commit(sink.open(db_url), "replayed", 1, first.attempt, staged)  # then the commit died
    txlog.fail("replayed", 1, first.attempt, error="commit task lost")  # and the txid replays
    second = txlog.begin("replayed", 1, source)
    runner.run(BatchJob("replayed", 1, second.attempt, source, sinks=(sink,)), txlog)
    result = commit_registered(txlog, "replayed", 1, second.attempt, [sink])
    assert result.details[sink.output_key]["action"] == "replace"
    # The table holds the committed attempt's rows once, and its files only.
    assert _table_rows(sink, db_url, "replayed") == _expected(data, [second])
    assert sink.open(db_url).committed_attempt("replayed", 1) == second.attempt
    assert not any(Path(p).exists() for p in staged.paths())  # the failed attempt's: cleaned up


@pytest.mark.scenario  # make test-scenarios; CI stages for the sinks on Spark Connect
def test_spark_submit_jobs_stage_for_the_sink_too(txlog, db_url, tmp_path, monkeypatch):
    from airflow_txn_provider.operators.spark_runner import SparkSubmitRunner

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL2", "spark://local%5B2%5D?deploy-mode=client")
    data, source = _source(tmp_path, seed=31)
    sink = _sink("iceberg", tmp_path, txid_column="txid")  # the catalog from the job's log URL
    txlog.register_pipeline("submitted", source_kind="transactional", max_pending=4)
    runner = SparkSubmitRunner(
        WORD_COUNT,
        log_url=db_url,
        conn_id="spark_local2",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    emissions = [txlog.begin_next("submitted", source) for _ in range(2)]
    for e in emissions:
        runner.run(BatchJob("submitted", e.txid, e.attempt, source, sinks=(sink,)))
    for e in emissions:
        commit_registered(txlog, "submitted", e.txid, e.attempt, [sink])
    assert _table_rows(sink, db_url, "submitted") == _expected(data, emissions)


def test_staged_files_that_are_gone_fail_the_commit_and_the_txid_replays(
    txlog, db_url, tmp_path, runner
):
    data, source = _source(tmp_path, seed=41)
    sink = _sink("delta", tmp_path, txid_column="txid")
    txlog.register_pipeline("gone", source_kind="transactional", max_pending=4)
    first = txlog.begin_next("gone", source)
    runner.run(BatchJob("gone", 1, first.attempt, source, sinks=(sink,)), txlog)
    staged = StagedFiles.from_json(txlog.transaction("gone", 1).output[sink.output_key])
    Path(staged.paths()[0]).unlink()  # e.g. a VACUUM with zero retention
    with pytest.raises(LakeSinkError, match="staged files are gone"):
        commit_registered(txlog, "gone", 1, first.attempt, [sink])
    assert txlog.transaction("gone", 1).status is TxStatus.FAILED
    assert sink.open().committed_txid("gone") == 0
    second = txlog.begin("gone", 1, source)
    runner.run(BatchJob("gone", 1, second.attempt, source, sinks=(sink,)), txlog)
    commit_registered(txlog, "gone", 1, second.attempt, [sink])
    assert _table_rows(sink, db_url, "gone") == _expected(data, [second])


def test_a_duplicate_run_of_an_attempt_keeps_the_recorded_files_and_discards_its_own(
    txlog, db_url, tmp_path, runner, monkeypatch
):
    import airflow_txn_provider.spark.job as job_module

    data, source = _source(tmp_path, seed=45)
    sink = _sink("delta", tmp_path, txid_column="txid")
    txlog.register_pipeline("dup", source_kind="transactional", max_pending=4)
    e = txlog.begin_next("dup", source)
    job = BatchJob("dup", 1, e.attempt, source, sinks=(sink,))
    assert runner.run(job, txlog).status == "processed"
    recorded = txlog.transaction("dup", 1).output[sink.output_key]["directory"]
    # A second run of the same attempt that started before the first recorded its output (a
    # retried task whose first try was still running): it writes its own files...
    monkeypatch.setattr(job_module, "attempt_may_stage", lambda *a, **k: True)
    assert runner.run(job, txlog).status == "processed"  # ...the log calls it a duplicate
    assert txlog.transaction("dup", 1).output[sink.output_key]["directory"] == recorded
    txid_dir = Path(sink.txid_dir("dup", 1))
    assert [p.name for p in txid_dir.iterdir()] == [Path(recorded).name]  # its own: discarded
    commit_registered(txlog, "dup", 1, e.attempt, [sink])
    assert _table_rows(sink, db_url, "dup") == _expected(data, [e])
