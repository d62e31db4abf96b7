"""A lake sink's staging (sinks/staging.py) on Spark Connect and real Delta and Iceberg tables: a
batch that does not match the table fails its attempt with a typed error before it is recorded."""

from __future__ import annotations

import pytest

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.rules.exceptions import LakeSchemaMismatchError, ProcessingError
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.transactions.commit import commit_registered
from tests.integration.sinks.test_lake_tables import WORD_COUNT, _sink, _source


@pytest.fixture
def runner(connect_server):
    return SparkConnectRunner(WORD_COUNT, url=connect_server.url)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_batch_that_does_not_match_the_table_fails_with_a_typed_error(
    kind, txlog, db_url, tmp_path, runner
):
    _, source = _source(tmp_path, seed=17)
    with_txid = _sink(kind, tmp_path, txid_column="txid")
    txlog.register_pipeline("schema", source_kind="transactional", max_pending=4)
    e = txlog.begin_next("schema", source)
    runner.run(BatchJob("schema", 1, e.attempt, source, sinks=(with_txid,)), txlog)
    commit_registered(txlog, "schema", 1, e.attempt, [with_txid])
    # The same table, now fed batches without the txid column.
    without = _sink(kind, tmp_path)
    e2 = txlog.begin_next("schema", source)
    with pytest.raises(LakeSchemaMismatchError) as err:
        runner.run(BatchJob("schema", 2, e2.attempt, source, sinks=(without,)), txlog)
    assert isinstance(err.value, ProcessingError) is False
    message = str(err.value)
    assert "pipeline=schema txid=2 attempt=1" in message and "missing column 'txid'" in message
    assert txlog.transaction("schema", 2).status is TxStatus.FAILED
    assert with_txid.open(db_url).committed_txid("schema") == 1
