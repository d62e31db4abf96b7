"""Outgrowing one machine: CeleryExecutor workers and a Spark standalone cluster, end to end.

Real components only, all on 127.0.0.1: Debian's Redis as the Celery broker, Airflow (scheduler,
dag-processor, triggerer, api-server) with two ``airflow celery worker`` processes, each its own
"host", a Spark standalone master with two workers behind a Spark Connect server, and Postgres
for both Airflow's metadata and the transaction log. Txids process on both Celery workers and on
executors of both Spark workers; one Celery worker is SIGKILLed, with its task processes, while
it runs a txid's job and stays down. The other worker must carry the pipeline to the end: every
txid commits, in txid order, and the state equals word counts computed in plain Python.

Retention runs too (``keep_txids`` 2): the 16th commit deletes the DAG runs of txids up to 14
through the real REST API, the 18th prunes the log's rows of txids up to 16 (both act once 16
txids are due: config.PRUNE_EVERY).
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from airflow_txn_provider.state import MapState
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import new_database, wait_until
from tests.spark_data import parquet_dataset, random_lines, word_counts
from txn_testing.airflow import (
    CELERY_WORKER,
    AirflowStack,
    _descendants,
    txn_log_connection_env,
)
from txn_testing.redis import RedisServer
from txn_testing.spark import SparkConnectServer, StandaloneCluster

pytestmark = pytest.mark.scenario  # make test-scenarios: a whole cluster's shape, ~5 minutes

DAGS = Path(__file__).resolve().parents[2] / "dags"
PIPELINE = "celery_words"
TXIDS = 18
KEEP = 2
BATCH = 12
SEED = 2026
WORKERS = (CELERY_WORKER.format(1), CELERY_WORKER.format(2))
_PID = re.compile(r"pid (\d+)\)")


@pytest.fixture
def cluster(postgres, db_url, tmp_path):
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    data = {p: random_lines(rng.randrange(2**31), TXIDS * BATCH) for p in ("0", "1")}
    with (
        RedisServer(workdir=tmp_path / "redis") as redis,
        StandaloneCluster(
            workers=2, worker_cores=1, worker_memory="1g", workdir=tmp_path / "sa"
        ) as spark,
        SparkConnectServer(
            master=spark.master_url,
            workdir=tmp_path / "connect",
            # one single-core executor on each worker
            conf={"spark.executor.cores": "1", "spark.cores.max": "2"},
        ) as connect,
    ):
        env = {
            "TXN_TEST_PIPELINE": PIPELINE,
            "TXN_TEST_DATA": str(parquet_dataset(tmp_path / "data", data)),
            "TXN_TEST_BATCH": str(BATCH),
            "TXN_TEST_MAX_PENDING": "4",
            "TXN_TEST_MAX_ATTEMPTS": "3",
            "TXN_TEST_LEASE_TIMEOUT": "10",
            "TXN_TEST_KEEP_TXIDS": str(KEEP),
            **txn_log_connection_env("txn_log_default", db_url),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect.url,
        }
        airflow = AirflowStack(
            tmp_path / "airflow",
            new_database(postgres, migrated=False),
            DAGS,
            env=env,
            celery_broker=redis.url,
            celery_workers=2,
            celery_concurrency=2,
            failure_injection=False,
        )
        try:
            airflow.start()
            yield airflow, connect, spark, [line for p in data.values() for line in p]
        finally:
            airflow.stop()
            assert not airflow.procs


def _worker_running(airflow: AirflowStack, txlog: TransactionLog) -> tuple[int, str] | None:
    """A txid whose processing task holds its lease now, and the Celery worker it runs under."""
    for info in txlog.transactions(PIPELINE):
        match = _PID.search(info.lease_holder or "")
        if info.status.value != "processing" or not match:
            continue
        pid = int(match.group(1))
        for worker in WORKERS:
            proc = airflow.procs.get(worker)
            if proc is not None and pid in _descendants(proc.pid):
                return info.txid, worker
    return None


# Its fixture alone starts Redis, four JVMs and six Airflow processes: minutes on a slow day.
@pytest.mark.timeout(1200)
def test_celery_workers_and_a_standalone_cluster_survive_a_killed_worker(cluster, db_url):
    airflow, connect, spark, lines = cluster
    api = airflow.client()
    api.wait_for_dag(PIPELINE)
    txlog = TransactionLog.from_url(db_url, migrate=False)
    api.unpause(PIPELINE)

    # Both workers take txids before one dies (each has 2 slots, max_pending is 4).
    def hosts_of_processing() -> set[str]:
        hosts = set()
        for run in api.runs(PIPELINE):
            for ti in api.task_instances(PIPELINE, run["dag_run_id"]):
                if ti["task_id"].startswith("process") and ti.get("hostname"):
                    hosts.add(ti["hostname"])
        return hosts

    wait_until(lambda: set(WORKERS) <= hosts_of_processing(), 300, "both workers", airflow)
    txid, worker = wait_until(
        lambda: _worker_running(airflow, txlog), 240, "a txid processing", airflow
    )
    airflow.kill(worker, signal.SIGKILL)  # the worker and its task processes, mid-job
    killed_at = time.monotonic()
    print(f"SIGKILLed {worker} while it processed txid {txid}")

    # the survivor processes the killed txid again (its attempt's lease ran out)
    wait_until(lambda: txlog.last_committed(PIPELINE) >= txid, 300, "the killed txid", airflow)
    print(f"txid {txid} committed {time.monotonic() - killed_at:.0f} s after the kill")
    alive = next(w for w in WORKERS if w != worker)
    attempts = txlog.attempts(PIPELINE, txid)
    assert len(attempts) >= 2 and attempts[0].status.value == "failed", attempts
    final = [
        ti["hostname"]
        for ti in api.task_instances(PIPELINE, txid_run_id(txid))
        if ti["task_id"].startswith("process")
    ]
    assert final == [alive], final

    wait_until(
        lambda: txlog.last_committed(PIPELINE) == TXIDS, 420, "every txid to commit", airflow
    )
    print(f"healed: txid {TXIDS} committed {time.monotonic() - killed_at:.0f} s after the kill")
    # retention kept the newest KEEP txids' rows; the older ones are counted, not listed
    infos = txlog.transactions(PIPELINE)
    assert [i.txid for i in infos] == [17, 18], infos
    assert all(i.status.value == "committed" for i in infos)
    committed_at = [i.committed_at for i in infos]
    assert committed_at == sorted(committed_at), "commits out of txid order"
    kept = txlog.retention(PIPELINE)
    assert (kept.pruned_txids, kept.pruned_through_txid) == (16, 16)
    # every line counted exactly once
    state = MapState(PIPELINE, f"{PIPELINE}_counts", "transactional", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
    assert got == dict(word_counts(lines))

    # ... and so did Airflow: the older txids' runs were deleted through the REST API
    # (runs 11-14 may still have been finishing at that commit: those wait for the next prune)
    remaining = {r["dag_run_id"] for r in api.runs(PIPELINE)}
    assert {txid_run_id(t) for t in range(15, TXIDS + 1)} <= remaining, remaining
    assert not {txid_run_id(t) for t in range(1, 11)} & remaining, remaining
    # Spark ran tasks on executors of both standalone workers
    app = httpx.get(f"{connect.ui_url}/api/v1/applications", timeout=10).json()[0]["id"]
    executors = httpx.get(
        f"{connect.ui_url}/api/v1/applications/{app}/allexecutors", timeout=10
    ).json()
    busy = [e for e in executors if e["id"] != "driver" and e["totalTasks"] > 0]
    assert len(busy) >= 2, executors
    assert spark.status()["aliveworkers"] == 2
    txlog.engine.dispose()
