"""``dag.test()`` of a built DAG on a real Postgres log and a real Spark Connect server (local).

Each txid is one manual run naming its txid in conf; begin, process, gate and commit run in this
process, the failure sensor skips (a manual run has nobody to restart it).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine

from airflow_txn_provider.state import MapState
from airflow_txn_provider.timetables import txid_logical_date
from tests.conftest import load_dag_file, set_txn_log_connection
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_dag_test_commits_each_txid_in_order(
    airflow_db, db_url, tmp_path, connect_server, monkeypatch
):
    data = {"a": random_lines(11, 30), "b": random_lines(12, 20)}
    path = parquet_dataset(tmp_path / "ds", data)
    monkeypatch.setenv("TXN_TEST_PIPELINE", "dagtest_words")
    monkeypatch.setenv("TXN_TEST_DATA", str(path))
    monkeypatch.setenv("TXN_TEST_BATCH", "10")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_server.url)
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    dag = load_dag_file(DAGS / "txn_words.py").dag

    metadata = []
    for txid in (1, 2, 3):
        run = dag.test(logical_date=txid_logical_date(txid), run_conf={"txid": txid})
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert run.state == "success", states
        assert states["watch_failures"] == "skipped"
        assert states["commit"] == "success"

    from airflow_txn_provider.transactions.transaction_log import TransactionLog

    txlog = TransactionLog.from_url(db_url)
    assert txlog.last_committed("dagtest_words") == 3
    metadata = [txlog.transaction("dagtest_words", t).metadata for t in (1, 2, 3)]
    assert metadata[0] == {"a": [0, 10], "b": [0, 10]}
    expected = word_counts(line for m in metadata for line in lines_in_ranges(data, m))
    state = MapState("dagtest_words", "dagtest_words_counts", keys={"word": "text"})
    engine = create_engine(db_url)
    with engine.connect() as conn:
        assert {k[0]: v for k, v in state.items(conn).items()} == dict(expected)
    engine.dispose()
    txlog.engine.dispose()
