"""No process carries a Spark session's mode into its next job (issue 55), on a real classic
session, a real Spark Connect server and a real Postgres log.

PySpark marks a process as "Spark Connect" (``SPARK_CONNECT_MODE_ENABLED`` and kin) when it opens
a remote session and never unmarks it; a classic session of the process then asks for the active
session on its next read and fails with ``SESSION_ALREADY_EXIST``. CI lost five tests to it: the
fill chaos test's live loop opened a remote session in the pytest worker's process, and every
later file on that worker that used the classic session failed at txid 1. An Airflow worker's
process that runs a classic fill driver and Connect txids one after another is the same case.
"""

from __future__ import annotations

import os

import pytest

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner, load_job_module
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.connect_sessions import connect_session
from airflow_txn_provider.spark.job import CONNECT_MODE_ENV, BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
WORD_COUNT = os.path.join(ROOT, "spark_jobs", "word_count.py")


def test_classic_and_connect_jobs_take_turns_in_one_process_in_the_order_that_failed(
    txlog, spark, connect_server, tmp_path
):
    data = {str(i): random_lines(55 + i, 60) for i in range(2)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    counts = MapState("turns", "turns_counts", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline("turns", source_kind="transactional", max_pending=4, states=[counts])
    transform = load_job_module(WORD_COUNT).transform
    metadata = []

    def one(session) -> None:
        e = txlog.begin_next("turns", source)
        assert e is not None and e.emitted
        metadata.append(e.metadata)
        process_batch(session, txlog, BatchJob("turns", e.txid, e.attempt, source), transform)
        assert commit_registered(txlog, "turns", e.txid, e.attempt).applied

    one(spark)  # a classic job (the `spark` fixture's session runs on, as a driver's would)
    with connect_session(connect_server.url) as remote:  # a Connect job beside it
        one(remote)
    assert not [n for n in CONNECT_MODE_ENV if n in os.environ]
    one(spark)  # the classic session again: before the fix, SESSION_ALREADY_EXIST here
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    e = txlog.begin_next("turns", source)  # the provider's Connect runner, as a task runs it
    assert e is not None
    metadata.append(e.metadata)
    runner.run(BatchJob("turns", e.txid, e.attempt, source), txlog)
    assert commit_registered(txlog, "turns", e.txid, e.attempt).applied
    assert not [n for n in CONNECT_MODE_ENV if n in os.environ]
    one(spark)

    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in counts.items(conn).items()}
    lines = [line for m in metadata for line in lines_in_ranges(data, m)]
    assert got == dict(word_counts(lines))


def test_the_marks_alone_break_a_classic_session_which_is_why_every_job_undoes_them(
    spark, tmp_path, monkeypatch
):
    data = {"0": random_lines(7, 10)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    assert source.read_batch(spark, {"0": [0, 10]}).count() == 10
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # what a remote session leaves
    with pytest.raises(Exception, match="SESSION_ALREADY_EXIST"):
        source.read_batch(spark, {"0": [0, 10]}).count()
