"""The cores a Spark offers (spark/cores.py), on a real Spark Connect server (local[2]), a classic
session and a real Postgres log: a window that fits Spark follows the cores its txids see."""

from __future__ import annotations

from sqlalchemy import text

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.integration.spark.test_job import WORD_COUNT, _committed_counts, _expected, _parquet


def test_a_window_that_fits_spark_follows_the_cores_of_its_server(
    txlog, tmp_path, connect_server, spark
):
    from airflow_txn_provider.spark.cores import spark_cores

    data, source = _parquet(tmp_path, seed=20)
    txlog.register_pipeline("fits", source_kind="transactional", max_pending=None)
    state = MapState("fits", "fits_words", keys={"word": "text"}).create(txlog.engine)
    with txlog.engine.begin() as conn:  # as an earlier explicit max_pending left it
        conn.execute(text("UPDATE txn_pipeline SET max_pending = 9 WHERE name = 'fits'"))
    runner = SparkConnectRunner(WORD_COUNT, url=connect_server.url)
    e = txlog.begin_next("fits", source)
    runner.run(BatchJob("fits", e.txid, e.attempt, source, fit_window=True), txlog)
    assert txlog.view("fits").max_pending == 3  # the server is local[2]: one per core, one beside
    assert commit_registered(txlog, "fits", e.txid, e.attempt).applied
    assert _committed_counts(txlog, state) == _expected(data, [e])
    assert spark_cores(spark) == 2  # a classic session (spark-submit, standalone): its context
    assert BatchJob.from_args(BatchJob("p", 1, 1, source, fit_window=True).to_args()).fit_window
