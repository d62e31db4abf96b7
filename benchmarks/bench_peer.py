"""This project's pipeline on a real Airflow vs Spark Structured Streaming ``foreachBatch``.

Run with ``make bench-peer``. One run, the same data and the same word count on both sides:

* the data: a Parquet dataset of 4 partitions, ``line`` = one word, one file per partition per
  batch; at each batch size (1e5 rows x 20 batches and 1e6 rows x 10 batches by default);
* **the peer**: Spark Structured Streaming reading those files (``maxFilesPerTrigger=4``: one
  batch per trigger, ``Trigger.AvailableNow``), the same ``transform`` as
  ``spark_jobs/word_count.py``, and a ``foreachBatch`` that upserts the batch's counts into
  Postgres idempotently by ``batchId`` (a batch already applied is skipped) — the exactly-once
  recipe of the Spark docs. Classic PySpark, ``local[N]``, N the CPUs Spark runs on;
* **this project without Airflow** (the floor of its Spark and Postgres path): the same job and
  Spark Connect server driven by the core loop in one process (begin, process, commit, one txid
  after another, as the peer does), so what Airflow adds is the difference;
* **this project**: the same job in a ``TxnPipeline`` (its defaults: the window fits its Spark) on a
  real Airflow (LocalExecutor scheduler, dag-processor, triggerer, api-server) with a Spark
  Connect server ``local[N]``, both with ``spark.sql.shuffle.partitions=4``; the same Postgres.

Both results are checked exact against a plain-Python count of the input, and no run may
re-emit a txid (an attempt beyond its first: nothing fails on purpose here; exit 1 otherwise).
Printed: rows/s of both and their ratio, the re-emissions of each run of this project; per-batch
latency p50/p95 (the peer's trigger duration; this project's begin -> committed); where a
txid's time goes, from the log's timestamps, the job's own timings and Airflow's task-instance
timestamps (the lead a run made ahead needs: its creation to its processing task running), with
how many txids, Spark jobs and processing tasks were in flight at once on average; and the CPU
seconds each side spends per batch, by process
group (every process of the run is a child of this one: Spark's JVMs, Postgres, Airflow and its
task processes, this driver), which on two cores bounds the rows/s any side can reach. First, on
the same Airflow, its floor: CPU per DAG run of two DAGs whose tasks do nothing
(``benchmarks/dags/airflow_floor.py``), one worker task per run and this provider's shape.

The peer is warm, as a long-running stream is: before its timed stream, an untimed one over
``WARMUP_BATCHES`` batches of the same shape runs in the same Spark session (its micro-batch
times are printed; the first is the cold cost). ``--cold-peer`` times it from a fresh session, as
before issue 57. The core loop likewise runs the warm-up batches through its Spark Connect
server before it is timed (on Airflow the server is warm already: the core loop ran first).

Usage: python benchmarks/bench_peer.py [--sizes 100000:20,1000000:20] [--max-pending N]
       [--floor-runs 20] [--worker-start] [--no-preload] [--cold-peer] [--pin-spark]

``--pin-spark`` is the second shape ``make bench-peer`` runs: every Spark JVM of both sides pinned
to the same CPUs (the upper half), Airflow, Postgres and the drivers on the rest, as a deployment
with Airflow on other hosts than Spark gives; both Sparks are then ``local[N]`` with N the CPUs
they are pinned to, as a Spark of its own knows its cores.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import create_engine, text

from airflow_txn_provider.compat.python import fromisoformat
from airflow_txn_provider.rules.config import fitted_window
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
# The peer's classic Spark session binds its driver here, not on the host's address: loopback only
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(ROOT))
from chaos.report import reemissions  # noqa: E402
from spark_jobs.word_count import transform  # noqa: E402
from txn_testing.airflow import AirflowStack, txn_log_connection_env  # noqa: E402
from txn_testing.cpu import (  # noqa: E402
    AIRFLOW,
    AIRFLOW_GROUPS,
    DRIVER,
    POSTGRES,
    SPARK,
    cpu_by_group,
    cpu_since,
    pin,
    postmaster_pid,
    spark_jvms,
)
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

PARTITIONS = 4
DATA_SCHEMA = "offset BIGINT, line STRING"
"""The files' columns, declared on both sides: Structured Streaming's file source asks for them."""
SEED = 12
VOCABULARY = [f"w{i}" for i in range(1000)]
SPARK_CPUS_ENV = "BENCH_PEER_SPARK_CPUS"
"""Set by ``--pin-spark``: the CPUs every Spark JVM of the run is pinned to (comma-separated)."""
WARMUP_BATCHES = 3
"""Batches of the peer's untimed warm-up stream, per size."""
SPARK_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}


def spark_master() -> str:
    """Both sides' Spark master: ``local[N]``, N the CPUs its JVMs run on (the machine's, or with
    ``--pin-spark`` the ones they are pinned to), as a Spark of its own knows its cores."""
    cpus = os.environ.get(SPARK_CPUS_ENV)
    return f"local[{len(cpus.split(',')) if cpus else os.cpu_count() or 2}]"


def pin_spark() -> None:
    """With ``--pin-spark``: pin every Spark JVM under this process to the Spark CPUs (the rest
    of the run, which started from this process, stays on the others)."""
    cpus = os.environ.get(SPARK_CPUS_ENV)
    if cpus:
        for pid in spark_jvms():
            pin(pid, {int(c) for c in cpus.split(",")})


# -- the data ------------------------------------------------------------------------------------


def write_dataset(root: Path, batch_rows: int, batches: int, seed: int) -> Counter[str]:
    """One file per partition per batch (``batch_rows / 4`` rows each), offsets consecutive per
    partition; file modification times increase with the batch, so the file stream takes the
    batches in the same order as the txids. Returns the ground truth word counts."""
    rng = random.Random(seed)
    per = batch_rows // PARTITIONS
    truth: Counter[str] = Counter()
    base = time.time() - batches - 10
    for b in range(batches):
        for p in range(PARTITIONS):
            words = rng.choices(VOCABULARY, k=per)
            truth.update(words)
            directory = root / f"p={p}"
            directory.mkdir(parents=True, exist_ok=True)
            file = directory / f"part-{b:05d}.parquet"
            offsets = pa.array(range(b * per, (b + 1) * per), pa.int64())
            pq.write_table(pa.table({"offset": offsets, "line": pa.array(words)}), file)
            os.utime(file, (base + b, base + b))
    return truth


# -- the peer: Spark Structured Streaming, foreachBatch --------------------------------------------


def run_peer(
    data: Path, pg_port: int, name: str, workdir: Path, warmup: Path | None = None
) -> dict[str, Any]:
    """The peer over ``data``; with ``warmup`` (batches of the same shape), first an untimed
    stream over those in the same Spark session, as a long-running stream is warm: its first
    micro-batch pays class loading, code generation and JIT, which a stream running for hours
    paid once. That first batch's time is reported apart (``cold_first_batch``)."""
    import psycopg2
    from psycopg2.extras import execute_values
    from pyspark.sql import SparkSession

    dsn = f"host=127.0.0.1 port={pg_port} user=postgres dbname=postgres"
    tables = [name] + ([f"{name}_warm"] if warmup is not None else [])
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for table in tables:
            cur.execute(
                f"CREATE TABLE {table}_counts (word text PRIMARY KEY, delta bigint NOT NULL)"
            )
            cur.execute(f"CREATE TABLE {table}_batches (batch_id bigint PRIMARY KEY)")
    builder = SparkSession.builder.master(spark_master()).appName(f"peer {name}")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    pin_spark()
    connection = psycopg2.connect(dsn)

    def upsert_into(table: str) -> Any:
        def upsert(batch: Any, batch_id: int) -> None:
            counts = [(r["word"], r["delta"]) for r in transform(batch).collect()]
            with connection, connection.cursor() as cur:  # one transaction per batch
                cur.execute(
                    f"INSERT INTO {table}_batches VALUES (%s) ON CONFLICT DO NOTHING", (batch_id,)
                )
                if cur.rowcount == 0:
                    return  # replayed batch: applied already
                execute_values(
                    cur,
                    f"INSERT INTO {table}_counts (word, delta) VALUES %s ON CONFLICT (word) "
                    f"DO UPDATE SET delta = {table}_counts.delta + EXCLUDED.delta",
                    counts,
                )

        return upsert

    def stream(path: Path, table: str) -> Any:
        source = (
            spark.readStream.schema(f"{DATA_SCHEMA}, p STRING")
            .option("maxFilesPerTrigger", PARTITIONS)
            .parquet(str(path))
        )
        return (
            source.writeStream.foreachBatch(upsert_into(table))
            .option("checkpointLocation", str(workdir / f"{table}-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    def trigger_seconds(query: Any) -> list[float]:
        return [
            p["durationMs"]["triggerExecution"] / 1000
            for p in query.recentProgress
            if p["numInputRows"]
        ]

    warm: list[float] = []
    if warmup is not None:
        query = stream(warmup, f"{name}_warm")
        query.awaitTermination()
        warm = trigger_seconds(query)
    cpu = cpu_by_group(POSTMASTERS)
    started = time.perf_counter()
    query = stream(data, name)
    query.awaitTermination()
    seconds = time.perf_counter() - started
    used = cpu_since(cpu, POSTMASTERS)
    durations = trigger_seconds(query)
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    batches = sum(1 for p in query.recentProgress if p["numInputRows"])
    spark.stop()
    with connection, connection.cursor() as cur:
        cur.execute(f"SELECT word, delta FROM {name}_counts")
        got = dict(cur.fetchall())
    connection.close()
    return {
        "seconds": seconds,
        "rows": rows,
        "batches": batches,
        "latency": durations,
        "got": got,
        "cpu": used,
        "warmup": warm,
    }


def spark_floor_batches(data: Path, batches: int) -> None:
    """Each batch's files read, transformed and collected in one classic session, nothing else."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spark_master()).appName("Spark's floor")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    pin_spark()
    for b in range(batches):
        files = sorted(str(f) for f in data.glob(f"p=*/part-{b:05d}.parquet"))
        batch = (
            spark.read.schema(f"{DATA_SCHEMA}, p STRING")
            .option("basePath", str(data))
            .parquet(*files)
        )
        transform(batch).collect()
    spark.stop()


def run_spark_floor(data: Path, batches: int) -> dict[str, Any]:
    """Spark's own floor per batch: :func:`spark_floor_batches` in a process and JVM of its own
    (started cold, as the peer's), with no stream, log, Postgres or session per batch around the
    work: the least Spark CPU a side can spend on these batches with this transform. Its CPU is
    the whole process tree's (the JVM and the Python driver)."""
    import subprocess

    cpu = cpu_by_group(POSTMASTERS)
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--spark-floor-of",
            str(data),
            "--spark-floor-batches",
            str(batches),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    used = cpu_since(cpu, POSTMASTERS)
    return {
        "seconds": seconds,
        "cpu": sum(v for g, v in used.items() if g not in (AIRFLOW, POSTGRES)),
    }


POSTMASTERS: dict[int, str] = {}
"""The benchmark's Postgres (the log's and Airflow's metadata database), counted as its group."""
IDLE_SAMPLE, IDLE_SETTLE = 10.0, 20.0
"""Seconds Airflow's CPU use is sampled with no txid to run, after as many seconds for the work
before it to settle (the last runs' callbacks, the previous pipeline's pause and the API reads
of its runs: sampled at once, they doubled the idle rate)."""
STEADY_FROM, STEADY_TAIL, STEADY_MIN_TXIDS = 3, 2, 10
"""This project's steady state on Airflow: from its 3rd commit to the one 2 before its last; with
fewer than 10 txids between them the goal takes the whole run (a processing task commits the
txids waiting behind it at once, so a short window holds more commits than work, or fewer)."""
NO_STEADY: dict[str, Any] = {"txids": 0, "cpu": {}, "wall": float("nan")}
"""What a run too short for a steady window reports (fewer batches than its two ends)."""


# -- this project without Airflow: the core loop ------------------------------------------------


def run_core(
    txlog: TransactionLog, connect_url: str, name: str, data: Path, rows: int, batches: int
) -> dict[str, Any]:
    """Begin, process (Spark Connect), commit, one txid after another, in this process."""
    from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob
    from airflow_txn_provider.transactions.commit import commit_registered

    source = PartitionedParquetSource(
        str(data), max_per_partition=rows // PARTITIONS, schema=DATA_SCHEMA
    )
    state = MapState(name, f"{name}_counts", keys={"word": "text"})
    txlog.ensure_pipeline(name, source_kind="transactional", max_pending=1, states=[state])
    runner = SparkConnectRunner(ROOT / "spark_jobs" / "word_count.py", url=connect_url)
    latency = []
    cpu = cpu_by_group(POSTMASTERS)
    started = time.perf_counter()
    for _ in range(batches):
        t0 = time.perf_counter()
        emission = txlog.begin_next(name, source)
        assert emission is not None and emission.emitted, emission
        runner.run(BatchJob(name, emission.txid, emission.attempt, source), txlog)
        commit_registered(txlog, name, emission.txid, emission.attempt)
        latency.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - started
    used = cpu_since(cpu, POSTMASTERS)
    with txlog.engine.connect() as conn:
        got = {key[0]: value for key, value in state.items(conn).items()}
    infos = txlog.transactions(name)[:batches]
    attempts = {t.txid: txlog.attempts(name, t.txid) for t in infos}
    return {
        "seconds": seconds,
        "rows": rows * batches,
        "latency": latency,
        "got": got,
        "infos": infos,
        "tis": {},
        "attempts": attempts,
        "cpu": used,
    }


# -- this project on Airflow ---------------------------------------------------------------------


def run_ours(stack: AirflowStack, txlog: TransactionLog, name: str, batches: int) -> dict[str, Any]:
    api = stack.client()
    api.wait_for_dag(name)
    # Airflow's own background work (scheduler loop, triggerer, dag-processor, api-server),
    # measured with nothing to do, to tell it from what each txid costs.
    time.sleep(IDLE_SETTLE)
    idle_from, idle = cpu_by_group(POSTMASTERS), IDLE_SAMPLE
    time.sleep(idle)
    idle_cores = cpu_since(idle_from, POSTMASTERS).get(AIRFLOW, 0.0) / idle
    cpu = cpu_by_group(POSTMASTERS)
    started = time.perf_counter()
    api.unpause(name)
    deadline = time.monotonic() + 3600
    # Steady state, as the floor is measured: from the STEADY_FROM-th commit to the one that
    # leaves STEADY_TAIL to go (txids in flight at both ends), no start-up (the waker's first
    # look, the first imports) and no draining tail.
    steady_from = steady_used = None
    steady_to = max(STEADY_FROM + 1, batches - STEADY_TAIL)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            done = txlog.last_committed(name)
        except Exception:  # the pipeline registers itself with its first begin
            continue
        print(f"  {name}: {done}/{batches} committed", end="\r", flush=True)
        if steady_from is None and done >= STEADY_FROM:
            steady_from = (done, cpu_by_group(POSTMASTERS), time.perf_counter())
        elif steady_from is not None and steady_used is None and done >= steady_to:
            txids = done - steady_from[0]
            steady_used = {
                "txids": txids,
                "cpu": {g: v / txids for g, v in cpu_since(steady_from[1], POSTMASTERS).items()},
                "wall": (time.perf_counter() - steady_from[2]) / txids,
            }
        if done >= batches:
            used, wall = cpu_since(cpu, POSTMASTERS), time.perf_counter() - started
            break
    else:
        raise TimeoutError(f"{name}: not every txid committed\n{stack.tail()}")
    api.pause(name)
    print()
    infos = txlog.transactions(name)[:batches]
    runs = {r["dag_run_id"]: r for r in api.runs(name)}
    tis = {
        t.txid: api.task_instances(name, f"txid-{t.txid:06d}")
        for t in infos
        if f"txid-{t.txid:06d}" in runs
    }
    attempts = {t.txid: txlog.attempts(name, t.txid) for t in infos}
    state = MapState(name, f"{name}_counts", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        got = {key[0]: value for key, value in state.items(conn).items()}
    return {
        "infos": infos,
        "runs": runs,
        "tis": tis,
        "attempts": attempts,
        "got": got,
        "cpu": used,
        "airflow_idle": idle_cores * wall,
        "steady": steady_used or NO_STEADY,
        "idle_cores": idle_cores,
    }


FLOOR_DAGS = ("floor_one_task", "floor_txn_shape", "floor_txn_shape_in_triggerer")
"""benchmarks/dags/airflow_floor.py: DAG runs with no work, one run per 'txid'."""
PACED_FLOOR = "floor_txn_shape_paced"
"""benchmarks/dags/airflow_floor.py: ``floor_txn_shape`` whose runs hold the Spark's slots as long
as a txid's Spark work does at each size (the core loop's p50), :func:`paced_runs` at once."""


def master_cores() -> int:
    """The cores of both sides' Spark (``local[N]``: :func:`spark_master`)."""
    return int(spark_master().removeprefix("local[").removesuffix("]"))


def paced_runs() -> int:
    """The paced floor's runs at once: the window fitted to the Spark and one run waiting for a
    slot (a run made ahead), the least that keeps that Spark busy while Airflow starts runs."""
    return fitted_window(master_cores()) + 1


def pace_floor(pace: Path, core: dict[str, Any]) -> float:
    """Set the paced floor's hold (:data:`PACED_FLOOR`) to the core loop's p50 Spark seconds per
    txid at this size (what its Spark needs per batch, no Airflow); returns it."""
    spark = [
        float(a.timings["spark"])
        for attempts in core["attempts"].values()
        for a in attempts
        if getattr(a, "timings", None) and "spark" in a.timings
    ]
    seconds = pct(spark, 50)
    (pace / "seconds").write_text(f"{seconds:.3f}")
    return seconds


def run_floor(stack: AirflowStack, dag_id: str, runs: int) -> dict[str, Any]:
    """Airflow's CPU per DAG run of ``dag_id``, whose tasks do nothing, in steady state: from
    its fourth successful run since it was unpaused (a DAG run again, as the paced floor is at
    each size, starts over) to ``runs`` runs later (runs still in flight at either end cancel
    out), then paused. Run states are read every 2 s (each read costs the api-server a little)."""
    api = stack.client()
    api.wait_for_dag(dag_id)

    def successes() -> int:  # all of them, past the API's page of 100 runs
        found = api.call("GET", f"/dags/{dag_id}/dagRuns", params={"state": "success", "limit": 1})
        return int(found["total_entries"])

    before = successes()
    api.unpause(dag_id)
    deadline = time.monotonic() + 900

    def succeeded(at_least: int) -> int:
        while True:
            done = successes()
            if done >= at_least:
                return done
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id}: {done} runs succeeded\n{stack.tail()}")
            time.sleep(2.0)

    first = succeeded(before + 4)
    cpu, started = cpu_by_group(POSTMASTERS), time.perf_counter()
    last = succeeded(first + runs)
    used, wall = cpu_since(cpu, POSTMASTERS), time.perf_counter() - started
    api.pause(dag_id)
    done = last - first
    return {"runs": done, "cpu": {g: v / done for g, v in used.items()}, "wall": wall / done}


def when(value: str | None) -> datetime | None:
    return fromisoformat(value) if value else None


def breakdown(result: dict[str, Any]) -> dict[str, list[float]]:
    """Where each txid's time went (seconds), along its chain of tasks."""
    parts: dict[str, list[float]] = defaultdict(list)
    infos = result["infos"]
    previous_commit = None
    for info in infos:
        tis = [ti for ti in result["tis"].get(info.txid, []) if ti.get("start_date")]
        tis.sort(key=lambda ti: ti["start_date"])
        run = result.get("runs", {}).get(f"txid-{info.txid:06d}") or {}
        made = when(run.get("queued_at"))
        first = next((ti for ti in tis if str(ti["task_id"]).startswith("process_")), None)
        running = when(first["start_date"]) if first is not None else None
        if made and first is not None and running is not None:
            # the lead a run made ahead needs: from its creation to its processing task running
            scheduled = when(first.get("scheduled_when"))
            if scheduled:
                lead = (scheduled - made).total_seconds()
                parts["run made -> processing task scheduled"].append(lead)
            parts["run made -> processing task running"].append((running - made).total_seconds())
            if info.begun_at:
                waited = (info.begun_at - running).total_seconds()
                parts["processing task running -> txid begun"].append(waited)
        for ti in tis:
            queued, started = when(ti.get("queued_when")), when(ti["start_date"])
            ended = when(ti.get("end_date"))
            if queued and started:
                parts[f"task {ti['task_id']}: queued -> running"].append(
                    (started - queued).total_seconds()
                )
            if started and ended:
                parts[f"task {ti['task_id']} (running)"].append((ended - started).total_seconds())
        timings = {}
        for attempt in result["attempts"].get(info.txid, []):
            if attempt.attempt == info.attempt:
                timings = getattr(attempt, "timings", None) or {}
        for key, value in timings.items():
            parts[f"job: {key}"].append(float(value))
        if info.processed_at and info.committed_at:
            turn = info.processed_at
            if previous_commit is not None and previous_commit > turn:
                parts["waiting for its turn"].append((previous_commit - turn).total_seconds())
                turn = previous_commit
            else:
                parts["waiting for its turn"].append(0.0)
            parts["its turn -> committed"].append((info.committed_at - turn).total_seconds())
        previous_commit = info.committed_at
    return parts


def mean_at_once(spans: list[tuple[datetime | None, datetime | None]]) -> float:
    """How many of ``spans`` are open at once, on average over the time from the first start to
    the last end (Little's law: what the window keeps busy, whatever its size)."""
    closed = [(a, b) for a, b in spans if a is not None and b is not None and b > a]
    if not closed:
        return 0.0
    whole = (max(b for _, b in closed) - min(a for a, _ in closed)).total_seconds()
    return sum((b - a).total_seconds() for a, b in closed) / whole if whole > 0 else 0.0


def overlap(result: dict[str, Any]) -> dict[str, float]:
    """Txids in flight (begun, not committed), Spark jobs running and processing tasks running,
    each on average at once: a window that keeps Spark busy shows about as many Spark jobs at
    once as Spark has cores."""
    infos = result["infos"]
    spark: list[tuple[datetime | None, datetime | None]] = []
    for info in infos:
        for attempt in result["attempts"].get(info.txid, []):
            timings = getattr(attempt, "timings", None) or {}
            if attempt.attempt == info.attempt and "spark" in timings and info.begun_at:
                lead = float(timings.get("start", 0.0)) + float(timings.get("connect", 0.0))
                start = info.begun_at + timedelta(seconds=lead)
                spark.append((start, start + timedelta(seconds=float(timings["spark"]))))
    tasks = [
        (when(ti.get("start_date")), when(ti.get("end_date")))
        for tis in result["tis"].values()
        for ti in tis
        if str(ti.get("task_id", "")).startswith("process_")
    ]
    busy = {
        "txids in flight": mean_at_once([(i.begun_at, i.committed_at) for i in infos]),
        "Spark jobs running": mean_at_once(spark),
    }
    if result["tis"]:  # the core loop has no Airflow tasks
        busy["processing tasks running"] = mean_at_once(tasks)
    return busy


def summary(result: dict[str, Any], rows: int) -> dict[str, Any]:
    infos = result["infos"]
    first = min(i.begun_at for i in infos)
    last = max(i.committed_at for i in infos)
    latency = [(i.committed_at - i.begun_at).total_seconds() for i in infos]
    return {"seconds": (last - first).total_seconds(), "rows": rows, "latency": latency}


def pct(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000:20,1000000:20", help="ROWS:BATCHES,...")
    parser.add_argument(
        "--max-pending",
        type=int,
        default=None,
        help="the pipeline's max_pending (default: none, its window fits its Spark)",
    )
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="cold task processes: [txn_provider] preload_task_processes off (for comparison)",
    )
    parser.add_argument(
        "--floor-runs", type=int, default=20, help="runs of each no-work DAG (Airflow's floor)"
    )
    parser.add_argument(
        "--worker-start",
        action="store_true",
        help="commit and watch_failures start on a worker, as before issue 27 (for comparison)",
    )
    parser.add_argument(
        "--cold-peer",
        action="store_true",
        help="no untimed warm-up stream before the peer's timed one (as before issue 57)",
    )
    parser.add_argument(
        "--pin-spark",
        action="store_true",
        help="shape (b): every Spark JVM (both sides) on the upper half of the CPUs, Airflow, "
        "Postgres and the drivers on the rest (what Airflow on other hosts gives)",
    )
    parser.add_argument("--spark-floor-of", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--spark-floor-batches", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (data, logs) after the run"
    )
    args = parser.parse_args(argv)
    if args.spark_floor_of:  # the child process of run_spark_floor
        spark_floor_batches(args.spark_floor_of, args.spark_floor_batches)
        return 0
    sizes = [tuple(int(float(x)) for x in s.split(":")) for s in args.sizes.split(",")]
    shape = "(a) everything on every CPU"
    if args.pin_spark:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("--pin-spark needs two CPUs at least")
        spark_cpus = cpus[len(cpus) // 2 :]
        rest = set(cpus) - set(spark_cpus)
        os.environ[SPARK_CPUS_ENV] = ",".join(map(str, spark_cpus))
        os.sched_setaffinity(0, rest)  # every process started from here on inherits it
        shape = f"(b) every Spark JVM on CPUs {spark_cpus}, the rest on {sorted(rest)}"
    print(
        f"bench-peer: seed {args.seed}, sizes {sizes}, max_pending {args.max_pending}, "
        f"task processes {'cold' if args.no_preload else 'warm (airflow_txn_provider.preload)'}, "
        "commit and watch_failures start "
        + ("on a worker" if args.worker_start else "in the triggerer")
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    workdir.chmod(0o755)
    if not args.keep:  # its Postgres servers and data: hundreds of MB a run
        atexit.register(shutil.rmtree, workdir, True)
    datasets = {}
    for rows, batches in sizes:
        name = f"peer_{rows}"
        t0 = time.perf_counter()
        truth = write_dataset(workdir / name, rows, batches, args.seed + rows)
        datasets[name] = (workdir / name, rows, batches, truth)
        if not args.cold_peer:  # the peer's warm-up: same shape, other words
            write_dataset(workdir / f"warm_{name}", rows, WARMUP_BATCHES, args.seed + rows + 1)
        print(f"  data {name}: {rows * batches} rows in {time.perf_counter() - t0:.1f} s")

    peer, core, ours, floors, spark_floor, paced = {}, {}, {}, {}, {}, {}
    with EmbeddedPostgres(durable=False) as pg:
        POSTMASTERS[postmaster_pid(pg.datadir)] = POSTGRES
        for name, (data, rows, batches, truth) in datasets.items():
            print(f"peer (Structured Streaming foreachBatch): {name}", flush=True)
            warm = None if args.cold_peer else workdir / f"warm_{name}"
            found = run_peer(data, pg.port, f"sss_{name}", workdir, warm)
            assert found["got"] == dict(truth), f"{name}: Structured Streaming result is wrong"
            assert found["rows"] == rows * batches, found["rows"]
            peer[name] = found
            print(f"Spark's own floor (read, transform, collect; nothing else): {name}", flush=True)
            spark_floor[name] = run_spark_floor(data, batches)

        admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE meta"))
        admin.dispose()
        specs = [
            {
                "name": name,
                "data": str(data),
                "per_partition": rows // PARTITIONS,
                "schema": DATA_SCHEMA,
            }
            for name, (data, rows, _, _) in datasets.items()
        ]
        pace = workdir / "pace"  # the paced floor's Spark: a lock file per core
        pace.mkdir()
        for slot in range(master_cores()):
            (pace / f"slot-{slot}").touch()
        env = {
            "BENCH_FLOOR_PACE_DIR": str(pace),
            "BENCH_FLOOR_PACED_RUNS": str(paced_runs()),
            "BENCH_PEER_PIPELINES": json.dumps(specs),
            "BENCH_PEER_MAX_PENDING": str(args.max_pending or ""),
            "BENCH_PEER_TRIGGERER_START": "0" if args.worker_start else "1",
            **txn_log_connection_env("txn_log_default", pg.url.replace("+psycopg2", "")),
        }
        meta = pg.url.rsplit("/", 1)[0] + "/meta"
        with SparkConnectServer(
            workdir=workdir / "connect", conf=SPARK_CONF, master=spark_master()
        ) as connect:
            pin_spark()
            env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = connect.url
            txlog = TransactionLog.from_url(pg.url)
            for name, (data, rows, batches, truth) in datasets.items():
                print(f"this project without Airflow (core loop): {name}", flush=True)
                if not args.cold_peer:  # its Connect server warm too, as on Airflow
                    warm = workdir / f"warm_{name}"
                    run_core(txlog, connect.url, f"warm_core_{name}", warm, rows, WARMUP_BATCHES)
                found = run_core(txlog, connect.url, f"core_{name}", data, rows, batches)
                assert found["got"] == dict(truth), f"{name}: the core loop's result is wrong"
                core[name] = found
            stack = AirflowStack(
                workdir / "airflow",
                meta,
                ROOT / "benchmarks" / "dags",
                env=env,
                failure_injection=False,  # as in production: no Variable read per txid
                preload=not args.no_preload,
            )
            with stack:
                # First, while no pipeline run exists (a paused pipeline's runs still poll)
                for dag_id in FLOOR_DAGS:
                    print(f"Airflow's floor, runs with no work: {dag_id}", flush=True)
                    floors[dag_id] = run_floor(stack, dag_id, args.floor_runs)
                for name, (_, _rows, batches, truth) in datasets.items():
                    print(f"this project on Airflow: {name}", flush=True)
                    found = run_ours(stack, txlog, name, batches)
                    assert found["got"] == dict(truth), f"{name}: this project's result is wrong"
                    found["window"] = txlog.view(name).max_pending
                    print(f"  its window at the end: {found['window']} txids", flush=True)
                    ours[name] = found
                    held = pace_floor(pace, core[name])
                    print(f"Airflow's floor at this pace: runs holding Spark {held:.2f} s: {name}")
                    paced[name] = run_floor(stack, PACED_FLOOR, args.floor_runs)
                    paced[name]["held"] = held
                txlog.engine.dispose()

    print(
        f"\nbench-peer ({os.cpu_count()} cores, Spark {spark_master()}, max_pending "
        f"{args.max_pending or 'unset: the window fits Spark'}), "
        f"shape {shape}"
    )
    if not args.cold_peer:
        print(
            f"the peer is warm: an untimed stream of {WARMUP_BATCHES} batches of the same shape "
            "ran first in its Spark session (its micro-batches, seconds: the first is the cold "
            "cost a long-running stream pays once)"
        )
        for name, (_, rows, _, _) in datasets.items():
            warm = peer[name]["warmup"]
            print(f"  {rows:.0e}: " + ", ".join(f"{w:.2f}" for w in warm))
    header = (
        "| batch rows | Structured Streaming rows/s | this project without Airflow rows/s "
        "| this project on Airflow rows/s | on Airflow / SSS | without Airflow / SSS "
        "| SSS batch p50 / p95 | without Airflow txid p50 | on Airflow txid begin->committed "
        "p50 / p95 | re-emitted without / on Airflow |"
    )
    print(header)
    print("|---|---|---|---|---|---|---|---|---|---|")
    reemitted = {}
    for name, (_, rows, batches, _) in datasets.items():
        s, c = peer[name], core[name]
        o = summary(ours[name], rows * batches)
        sss_rate, core_rate = s["rows"] / s["seconds"], c["rows"] / c["seconds"]
        our_rate = o["rows"] / o["seconds"]
        print(
            f"| {rows:.0e} ({batches} batches) | {sss_rate:,.0f} | {core_rate:,.0f} "
            f"| {our_rate:,.0f} | **{our_rate / sss_rate:.2f}x** | {core_rate / sss_rate:.2f}x "
            f"| {pct(s['latency'], 50):.2f} / {pct(s['latency'], 95):.2f} s "
            f"| {pct(c['latency'], 50):.2f} s "
            f"| {pct(o['latency'], 50):.2f} / {pct(o['latency'], 95):.2f} s "
            f"| {reemissions(c['infos'])} / {reemissions(ours[name]['infos'])} |"
        )
        reemitted[f"core_{name}"] = reemissions(c["infos"])
        reemitted[name] = reemissions(ours[name]["infos"])
    print(
        "\nCPU seconds per batch, by process group (two cores give at most 2 CPU-s per second: "
        "rows/s <= 2 x rows per batch / CPU-s per batch)"
    )
    print("| batch rows | process group | Structured Streaming | without Airflow | on Airflow |")
    print("|---|---|---|---|---|")
    for name, (_, rows, batches, _) in datasets.items():
        sides = [peer[name]["cpu"], core[name]["cpu"], ours[name]["cpu"]]
        for group in [*sorted(set().union(*sides)), "all"]:
            cells = [
                (
                    sum(v for g, v in side.items() if g not in (AIRFLOW, POSTGRES))
                    if group == "all"
                    else side.get(group, 0.0)
                )
                / batches
                for side in sides
            ]
            label = "**all** (Postgres apart)" if group == "all" else group
            print(f"| {rows:.0e} | {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
            if group == AIRFLOW:
                idle = ours[name]["airflow_idle"] / batches
                print(
                    f"| {rows:.0e} | of which Airflow idle (its rate with no txid, "
                    f"{IDLE_SAMPLE:.0f} s sampled) | — | — | {idle:.2f} |"
                )
        # How busy each side of shape (b)'s split is while txids flow (steady state): what runs
        # beside Spark (Airflow, Postgres, drivers), and Spark, in CPU-s per second
        steady = ours[name]["steady"]
        beside = sum(steady["cpu"].get(g, 0.0) for g in (AIRFLOW, POSTGRES, DRIVER))
        print(
            f"| {rows:.0e} | steady: Airflow, Postgres and drivers / Spark, CPU-s per second "
            f"| — | — | {beside / steady['wall']:.2f} / "
            f"{steady['cpu'].get(SPARK, 0.0) / steady['wall']:.2f} |"
        )
    print(
        "\nAirflow's floor: CPU seconds per DAG run whose tasks do nothing, same stack "
        "(benchmarks/dags/airflow_floor.py; max_active_runs 4)"
    )
    print("| process group | " + " | ".join(FLOOR_DAGS) + " |")
    print("|---|" + "---|" * len(FLOOR_DAGS))
    for group in [*AIRFLOW_GROUPS, AIRFLOW]:
        cells = [f"{floors[d]['cpu'].get(group, 0.0):.2f}" for d in FLOOR_DAGS]
        print(f"| {group} | " + " | ".join(cells) + " |")
    print(
        "| wall seconds per run | "
        + " | ".join(f"{floors[d]['wall']:.2f}" for d in FLOOR_DAGS)
        + " |"
    )
    report_steady(datasets, core, ours, floors)
    report_paced(datasets, ours, floors, paced)
    print(
        "\nThe floor on Airflow, from this run: rows/s <= 2 cores x rows per batch / (Spark's own "
        "CPU-s per batch + Airflow's CPU-s per run of a DAG that does nothing), against Structured "
        "Streaming's rows/s"
    )
    print(
        "| batch rows | Spark's own floor CPU-s (SSS's Spark; without Airflow's) "
        "| Airflow's floor CPU-s "
        "| bound rows/s | bound / SSS |"
    )
    print("|---|---|---|---|---|")
    for name, (_, rows, batches, _) in datasets.items():
        own = spark_floor[name]["cpu"] / batches
        sss_spark = peer[name]["cpu"].get(SPARK, 0.0) / batches
        core_spark = core[name]["cpu"].get(SPARK, 0.0) / batches
        sss_rate = peer[name]["rows"] / peer[name]["seconds"]
        for dag_id in FLOOR_DAGS:
            airflow = floors[dag_id]["cpu"].get(AIRFLOW, 0.0)
            bound = 2 * rows / (own + airflow)
            print(
                f"| {rows:.0e} | {own:.2f} ({sss_spark:.2f}; {core_spark:.2f}) "
                f"| {airflow:.2f} ({dag_id}) "
                f"| {bound:,.0f} | {bound / sss_rate:.2f}x |"
            )
    for name in datasets:
        print(
            f"\nwhere a txid's time goes, {name} (seconds, p50 over {len(ours[name]['infos'])} "
            "txids)"
        )
        print("| part | on Airflow | without Airflow |")
        print("|---|---|---|")
        on, off = breakdown(ours[name]), breakdown(core[name])
        for part in sorted(set(on) | set(off)):
            cells = [f"{statistics.median(d[part]):.2f}" if part in d else "—" for d in (on, off)]
            print(f"| {part} | {' | '.join(cells)} |")
        busy_on, busy_off = overlap(ours[name]), overlap(core[name])
        for part in busy_on:
            off_cell = f"{busy_off[part]:.2f}" if part in busy_off else "—"
            print(f"| {part}, at once (mean over the run) | {busy_on[part]:.2f} | {off_cell} |")
    goals = report_goals(args, datasets, peer, ours, floors)
    spurious = {name: n for name, n in reemitted.items() if n}
    if spurious:  # nothing failed on purpose: a replay is a bug (issue 46)
        print(f"\nFAILED: txids re-emitted in fault-free runs: {spurious}")
        for name in spurious:
            side = core[name.removeprefix("core_")] if name.startswith("core_") else ours[name]
            for txid, attempts in side["attempts"].items():
                for a in attempts[:-1]:
                    print(f"  {name} txid {txid} attempt {a.attempt}: {a.error}")
        return 1
    print(f"\nre-emissions: none in any run ({', '.join(reemitted)})")
    return 0 if all(goals.values()) else 1


def report_steady(
    datasets: dict[str, Any], core: dict[str, Any], ours: dict[str, Any], floors: dict[str, Any]
) -> None:
    """Airflow's CPU per txid in steady state, as the floor is measured, group by group beside
    the floor of this provider's shape; then what of the difference is not orchestration: the
    job's own client work in the task process (what the core loop's driver spends per txid on
    the same job) and Airflow's idle rate over the longer wall time of a txid."""
    floor = floors["floor_txn_shape"]
    names = list(datasets)
    print(
        "\nAirflow's CPU seconds per txid in steady state (commit "
        f"{STEADY_FROM} to {STEADY_TAIL} before the last, as the floor is measured: no start-up)"
    )
    print("| process group | floor_txn_shape | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for group in [*AIRFLOW_GROUPS, AIRFLOW]:
        cells = [f"{ours[n]['steady']['cpu'].get(group, 0.0):.2f}" for n in names]
        print(f"| {group} | {floor['cpu'].get(group, 0.0):.2f} | " + " | ".join(cells) + " |")
    walls = [ours[n]["steady"]["wall"] for n in names]
    print(
        f"| wall seconds per txid | {floor['wall']:.2f} | "
        + " | ".join(f"{w:.2f}" for w in walls)
        + " |"
    )
    client = [core[n]["cpu"].get(DRIVER, 0.0) / datasets[n][2] for n in names]
    print(
        "| of which the job's own client work (the core loop's driver per txid) | — | "
        + " | ".join(f"{c:.2f}" for c in client)
        + " |"
    )
    # the lowest idle rate sampled (a sample right after other work runs high)
    rate = min(ours[n]["idle_cores"] for n in names)
    idle = [rate * max(0.0, w - floor["wall"]) for w in walls]
    print(
        f"| of which Airflow's idle rate ({rate:.2f} CPU-s/s) over the wall beyond the floor's "
        "run | — | " + " | ".join(f"{i:.2f}" for i in idle) + " |"
    )
    left = [
        ours[n]["steady"]["cpu"].get(AIRFLOW, 0.0) - c - i - floor["cpu"].get(AIRFLOW, 0.0)
        for n, c, i in zip(names, client, idle, strict=True)
    ]
    print(
        "| orchestration beyond the floor (all - floor - client work - idle) | 0.00 | "
        + " | ".join(f"{x:.2f}" for x in left)
        + " |"
    )


def report_paced(
    datasets: dict[str, Any],
    ours: dict[str, Any],
    floors: dict[str, Any],
    paced: dict[str, Any],
) -> None:
    """Airflow's floor at the pace Spark sets (:data:`PACED_FLOOR`) beside the no-work floor and
    this provider's steady CPU per txid, group by group: what the grid's shape costs Airflow
    when its runs last as long as a txid's Spark work makes them last, with no work of its own
    (Airflow's own per-second costs, which no design of one run per txid avoids)."""
    floor = floors["floor_txn_shape"]
    names = list(datasets)
    print(
        f"\nAirflow's floor at Spark's pace ({PACED_FLOOR}: runs with no work holding one of the "
        f"Spark's {master_cores()} slot(s) for the core loop's p50 Spark seconds per txid, at most "
        f"{paced_runs()} at once), CPU seconds per run in steady state, beside "
        "this provider's per txid"
    )
    header = " | ".join(
        f"paced {datasets[n][1]:.0e} ({paced[n]['held']:.2f} s) | on Airflow {datasets[n][1]:.0e}"
        for n in names
    )
    print(f"| process group | floor_txn_shape | {header} |")
    print("|---|---|" + "---|---|" * len(names))
    for group in [*AIRFLOW_GROUPS, AIRFLOW]:
        cells = " | ".join(
            f"{paced[n]['cpu'].get(group, 0.0):.2f} | "
            f"{ours[n]['steady']['cpu'].get(group, 0.0):.2f}"
            for n in names
        )
        print(f"| {group} | {floor['cpu'].get(group, 0.0):.2f} | {cells} |")
    walls = " | ".join(f"{paced[n]['wall']:.2f} | {ours[n]['steady']['wall']:.2f}" for n in names)
    print(f"| wall seconds per run / txid | {floor['wall']:.2f} | {walls} |")
    base = floor["cpu"].get(AIRFLOW, 0.0)
    for n in names:
        at_pace = paced[n]["cpu"].get(AIRFLOW, 0.0)
        mine = ours[n]["steady"]["cpu"].get(AIRFLOW, 0.0)
        print(
            f"  {datasets[n][1]:.0e}: the shape at Spark's pace costs Airflow {at_pace:.2f} CPU-s "
            f"per run, {at_pace / base:.2f}x the no-work floor ({base:.2f}; 1.3x = "
            f"{1.3 * base:.2f}); on Airflow {mine:.2f} per txid, {mine / at_pace:.2f}x the paced "
            "floor"
        )


def report_goals(
    args: argparse.Namespace,
    datasets: dict[str, Any],
    peer: dict[str, Any],
    ours: dict[str, Any],
    floors: dict[str, Any],
) -> dict[str, bool]:
    """Issue 57's goals, from this run's figures: rows/s against the ceiling that one Airflow
    run per txid leaves on these cores (shape a) or against the peer (shape b), and Airflow's
    CPU per txid against its floor and across batch sizes."""
    shape_floor = floors["floor_txn_shape"]["cpu"].get(AIRFLOW, 0.0)
    one_task = floors["floor_one_task"]["cpu"].get(AIRFLOW, 0.0)
    goals: dict[str, bool] = {}
    per_txid: dict[int, float] = {}
    print("\ngoals (issue 57), from this run:")
    for name, (_, rows, batches, _) in datasets.items():
        sss_rate = peer[name]["rows"] / peer[name]["seconds"]
        o = summary(ours[name], rows * batches)
        ratio = o["rows"] / o["seconds"] / sss_rate
        c = sum(v for g, v in peer[name]["cpu"].items() if g not in (AIRFLOW, POSTGRES)) / batches
        steady = ours[name]["steady"]
        if steady["txids"] >= STEADY_MIN_TXIDS:  # measured as the floor is: steady state
            airflow, how = steady["cpu"].get(AIRFLOW, 0.0), f"steady, {steady['txids']} txids"
        else:  # too few txids for a steady window: commits come in bursts
            airflow, how = ours[name]["cpu"].get(AIRFLOW, 0.0) / batches, "start-up included"
        per_txid[rows] = airflow
        if args.pin_spark:
            goals[f"{rows:.0e}: on Airflow >= 1.0x SSS (shape b): {ratio:.2f}x"] = ratio >= 1.0
        else:
            for label, f in (("this provider's shape", shape_floor), ("one task", one_task)):
                ceiling = c / (c + f)
                goals[
                    f"{rows:.0e}: on Airflow >= 0.9 x the ceiling C/(C+F), F = {label}'s floor: "
                    f"{ratio:.2f}x against 0.9 x {c:.2f}/({c:.2f}+{f:.2f}) = {0.9 * ceiling:.2f}x"
                ] = ratio >= 0.9 * ceiling
        goals[
            f"{rows:.0e}: Airflow's CPU per txid ({how}) within 1.3x "
            f"its floor for this shape: {airflow:.2f} against {shape_floor:.2f} "
            f"({airflow / shape_floor:.2f}x)"
        ] = airflow <= 1.3 * shape_floor
    if len(per_txid) > 1:
        small, large = per_txid[min(per_txid)], per_txid[max(per_txid)]
        goals[
            f"Airflow's CPU per txid at {max(per_txid):.0e} within 1.3x the same at "
            f"{min(per_txid):.0e}: {large:.2f} against {small:.2f} ({large / small:.2f}x)"
        ] = large <= 1.3 * small
    for goal, met in goals.items():
        print(f"  [{'met' if met else 'NOT met'}] {goal}")
    return goals


if __name__ == "__main__":
    sys.exit(main())
