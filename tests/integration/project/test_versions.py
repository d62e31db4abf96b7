"""The Spark slice `make test-matrix` runs on every cell (docs/deployment.md, "Supported versions"):
one txid of each source kind (transactional: partitioned Parquet; opaque: a landing directory)
through the cell's own spark-submit, on ``local[2]`` and on a standalone master and worker started
from the cell's PySpark package; the same through Spark Connect where the cell's PySpark has it;
and the failure cascade with its replay, committed in order. Ground truth: word counts computed
in plain Python from the same records.

A ``scenario`` (a standalone cluster and several spark-submits, ~2 minutes): CI runs the default
cell's Spark tests instead, and the matrix runs this module on every cell.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyspark
import pytest

from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT
from airflow_txn_provider.operators.spark_runner import SparkConnectRunner, SparkSubmitRunner
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob
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

pytestmark = pytest.mark.scenario

WORD_COUNT = Path(__file__).resolve().parents[3] / "spark_jobs" / "word_count.py"
FAST_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}

Process = Callable[[BatchJob], None]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master and one worker of the cell's Spark (its PySpark package's)."""
    folder = tmp_path_factory.mktemp("standalone")
    with StandaloneCluster(worker_cores=2, worker_memory="1g", workdir=folder) as cluster:
        yield cluster


@pytest.fixture(params=["submit-local", "submit-standalone", "connect"])
def process(request, txlog, db_url, monkeypatch) -> Process:
    """How a txid is processed: the cell's spark-submit (local, or a standalone master), or
    Spark Connect."""
    if request.param == "connect":
        server = request.getfixturevalue("connect_server")  # skips without Spark Connect
        connect = SparkConnectRunner(WORD_COUNT, url=server.url)

        def on_connect(job: BatchJob) -> None:
            assert connect.run(job, txlog).status == "processed"

        return on_connect
    if request.param == "submit-local":
        conn: dict[str, object] = {"conn_type": "spark", "host": "local[2]"}
        conf = FAST_CONF
    else:
        cluster = request.getfixturevalue("standalone")
        conn = {"conn_type": "spark", "host": cluster.master_url}
        conf = {**FAST_CONF, "spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_MATRIX", json.dumps({**conn, "extra": {"deploy-mode": "client"}})
    )
    submit = SparkSubmitRunner(WORD_COUNT, log_url=db_url, conn_id="spark_matrix", conf=conf)
    return submit.run  # raises if the job fails


def _pipeline(txlog, name: str, kind: str) -> MapState:
    txlog.register_pipeline(name, source_kind=kind, max_pending=4)
    return MapState(name, f"{name}_words", kind, keys={"word": "text"}).create(txlog.engine)


def _counts(txlog, state: MapState) -> dict[str, int]:
    with txlog.engine.connect() as conn:
        return {key[0]: value for key, value in state.items(conn).items()}


def test_the_cell_runs_its_own_versions():
    """The cell is what `make test-matrix` says it is (TXN_MATRIX_CELL: python, pyspark)."""
    import os

    cell = os.environ.get("TXN_MATRIX_CELL")
    if not cell:
        pytest.skip("outside make test-matrix")
    want = json.loads(cell)
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == want["python"]
    assert pyspark.__version__.startswith(want["pyspark"])
    assert SUPPORTS_CONNECT is (int(pyspark.__version__.split(".")[0]) >= 4)


def test_a_transactional_txid_commits(txlog, tmp_path, process):
    data = {"0": random_lines(7, 30), "1": random_lines(8, 20)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 50)
    state = _pipeline(txlog, "matrix_tx", "transactional")
    emission = txlog.begin_next("matrix_tx", source)
    process(BatchJob("matrix_tx", emission.txid, emission.attempt, source))
    assert commit_registered(txlog, "matrix_tx", emission.txid, emission.attempt).applied
    assert _counts(txlog, state) == dict(word_counts(lines_in_ranges(data, emission.metadata)))


def test_an_opaque_txid_commits(txlog, tmp_path, process):
    root = tmp_path / "landing"
    files = {(p, seq): random_lines(10 * i + seq, 6) for i, p in enumerate("ab") for seq in (0, 1)}
    for (partition, seq), lines in files.items():
        write_landing_file(root, partition, seq, lines)
    source = LandingDirectorySource(str(root), max_files_per_partition=2)
    state = _pipeline(txlog, "matrix_opaque", "opaque")
    emission = txlog.begin_next("matrix_opaque", source)
    process(BatchJob("matrix_opaque", emission.txid, emission.attempt, source))
    assert commit_registered(txlog, "matrix_opaque", emission.txid, emission.attempt).applied
    read = [  # the metadata: each partition's range of file numbers [first, end)
        line
        for (partition, seq), lines in files.items()
        if emission.metadata[partition][0] <= seq < emission.metadata[partition][1]
        for line in lines
    ]
    assert read and _counts(txlog, state) == dict(word_counts(read))


def test_a_failure_fails_the_later_txids_and_the_replays_commit_in_order(
    txlog, tmp_path, process, request
):
    """The failure cascade: txid 1 fails after 2 and 3 processed; all three are replayed with the
    same batches and commit in order, each batch counted once."""
    if request.node.callspec.params["process"] == "submit-standalone":
        pytest.skip("the cascade is the log's: once per cell, on local[2] and on Connect")
    data = {"0": random_lines(11, 60)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 20)
    state = _pipeline(txlog, "matrix_cascade", "transactional")
    first = [txlog.begin_next("matrix_cascade", source) for _ in range(3)]
    for emission in first[1:]:
        process(BatchJob("matrix_cascade", emission.txid, emission.attempt, source))
    assert txlog.fail("matrix_cascade", 1, first[0].attempt, error="injected") == (1, 2, 3)
    assert {t.status for t in txlog.transactions("matrix_cascade")} == {TxStatus.FAILED}
    replays = [txlog.begin_next("matrix_cascade", source) for _ in range(3)]
    assert [r.txid for r in replays] == [1, 2, 3]
    assert [r.attempt for r in replays] == [e.attempt + 1 for e in first]
    assert [r.metadata for r in replays] == [e.metadata for e in first]  # transactional
    for replay in reversed(replays):  # processed in any order, committed in txid order
        process(BatchJob("matrix_cascade", replay.txid, replay.attempt, source))
    for replay in replays:
        assert commit_registered(txlog, "matrix_cascade", replay.txid, replay.attempt).applied
    assert _counts(txlog, state) == dict(word_counts(data["0"]))
