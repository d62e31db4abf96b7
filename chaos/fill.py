"""The fill chaos tier: an output filled from history while the live pipeline commits, with the
fill's process killed and the log's Postgres crashed at seeded moments (issue 44).

No Airflow: a live loop in a thread of this process plays the pipeline (begin, process on Spark
Connect, commit, one txid at a time; a txid a fault failed replays), and the fill runs in a child
process (``--child``: ``fill_pipeline``, as the fill DAG's task runs it), started again after
each kill as Airflow's retry would. Per run, from its seed:

* the data (2 partitions of seeded lines), the history (6..12 txids committed before the
  declaration, counting words into ``counts``), the fill's chunk (1..3 txids), the live txids
  after the declaration (8..14);
* the declaration adds ``lengths`` (an opaque state: line lengths) and ``firsts`` (a
  non-transactional one: words by first letter) with ``start="history"``;
* faults, each once the fill has logged a seeded number of steps (1..4, over all its processes),
  so it lands in the middle of the fill: ``kill_fill`` (SIGKILL its process group, a new one is
  started as Airflow's retry would) and ``restart_log_postgres`` (an immediate shutdown, the
  server down 1..3 s, then crash recovery: the UNLOGGED staging tables come back empty).

The checks, in plain Python over the committed txids' batches (their lines from the data): the
fill joined; ``counts`` holds every word once (0 lost, 0 doubled: the live pipeline through the
faults), and ``lengths`` and ``firsts`` equal their truth exactly (the fill through the faults,
each txid applied once, in order). Every run prints its seed; ``--seed S --runs 1`` replays it.

Usage: ``python chaos/fill.py --runs 6 --seed 2026``. Exits 1 if a run failed a check.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINE = "fill_chaos"
VOCABULARY = "ant bee cat dog elk fox gnu hen ibis jay kiwi lark mole newt owl".split()
FAULTS = ("kill_fill", "restart_log_postgres")
BOUND = 300.0
"""Seconds a run may take to heal and join before it counts as not recovered."""


@dataclass(frozen=True)
class RunPlan:
    seed: int
    history: int
    live: int
    chunk: int
    faults: tuple[tuple[str, int], ...]  # (kind, after how many of the fill's steps)
    down_for: float

    @property
    def txids(self) -> int:
        return self.history + self.live


def plan_run(seed: int, kinds: Sequence[str] = FAULTS) -> RunPlan:
    rng = random.Random(seed)
    faults = tuple(sorted(((k, rng.randint(1, 4)) for k in kinds), key=lambda f: f[1]))
    return RunPlan(
        seed,
        history=rng.randint(6, 12),
        live=rng.randint(8, 14),
        chunk=rng.randint(1, 3),
        faults=faults,
        down_for=round(rng.uniform(1.0, 3.0), 2),
    )


def lines(seed: int, partition: int, count: int) -> list[str]:
    rng = random.Random(seed * 10 + partition)
    return [" ".join(rng.choices(VOCABULARY, k=rng.randint(1, 6))) for _ in range(count)]


PER_TXID = 10  # lines per partition per txid


def transform(batch):  # the job after the declaration: every output
    from pyspark.sql import functions as F

    words = batch.select(F.explode(F.split("line", " ")).alias("word")).where("word != ''")
    return {
        "counts": words.groupBy("word").agg(F.count("*").alias("delta")),
        "lengths": batch.groupBy(F.length("line").cast("long").alias("n")).agg(
            F.count("*").alias("delta")
        ),
        "firsts": words.groupBy(F.substring("word", 1, 1).alias("letter")).agg(
            F.count("*").alias("delta")
        ),
    }


def counts_only(batch):  # the job before it
    return {"counts": transform(batch)["counts"]}


def outputs():
    from airflow_txn_provider.state import MapState

    return [
        MapState(PIPELINE, "counts", "transactional", keys={"word": "text"}),
        MapState(PIPELINE, "lengths", "opaque", keys={"n": "bigint"}),
        MapState(PIPELINE, "firsts", "non_transactional", keys={"letter": "text"}),
    ]


def child(argv: Sequence[str]) -> int:
    """The fill's process: what the fill DAG's task runs."""
    from pyspark.sql import SparkSession

    from airflow_txn_provider.spark.fill import fill_pipeline
    from airflow_txn_provider.spark.parquet_source import PartitionedParquetSource
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

    url, connect, data, chunk = argv
    logging.basicConfig(level=logging.WARNING)
    txlog = TransactionLog.from_url(url, migrate=False)
    spark = SparkSession.builder.remote(connect).create()
    report = fill_pipeline(
        txlog,
        PIPELINE,
        spark=spark,
        source=PartitionedParquetSource(data, PER_TXID),
        transforms=[transform],
        chunk=int(chunk),
        wait=0.2,
        on_progress=lambda line: print(line, flush=True),
    )
    print(json.dumps({"joined_after": report.joined_after}), flush=True)
    return 0


@dataclass
class RunResult:
    plan: RunPlan
    ok: bool
    lost: int
    doubled: int
    fill_exact: bool
    fill_starts: int
    seconds: float
    why: str = ""


def run_one(plan: RunPlan, pg, connect_url: str, workdir: Path) -> RunResult:
    from pyspark.sql import SparkSession
    from sqlalchemy import text

    from airflow_txn_provider.log.fill_progress import filling_outputs
    from airflow_txn_provider.rules.exceptions import TxnError
    from airflow_txn_provider.spark.job import BatchJob, process_batch
    from airflow_txn_provider.spark.parquet_source import PartitionedParquetSource
    from airflow_txn_provider.transactions.commit import commit_registered
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from tests.spark_data import parquet_dataset

    started = time.monotonic()
    name = f"r{plan.seed}"
    db = f"fill_{plan.seed}"
    from sqlalchemy import create_engine

    admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {db}"))
        conn.execute(text(f"CREATE DATABASE {db}"))
    admin.dispose()
    url = pg.url.rsplit("/", 1)[0] + f"/{db}"
    txlog = TransactionLog.from_url(url)
    data = {str(p): lines(plan.seed, p, plan.txids * PER_TXID) for p in (0, 1)}
    folder = parquet_dataset(workdir / name, data, file_rows=PER_TXID)
    source = PartitionedParquetSource(str(folder), PER_TXID)
    counts, lengths, firsts = outputs()
    spark = SparkSession.builder.remote(connect_url).create()

    def declare(states, **kw):
        txlog.ensure_pipeline(
            PIPELINE, source_kind="transactional", max_pending=2, states=states, **kw
        )

    def one(job) -> None:
        try:
            e = txlog.begin_next(PIPELINE, source)
            if e is None or not e.emitted:
                time.sleep(0.1)
                return
            process_batch(spark, txlog, BatchJob(PIPELINE, e.txid, e.attempt, source), job)
            commit_registered(txlog, PIPELINE, e.txid, e.attempt)
        except TxnError as err:  # a crash failed it: it replays
            print(f"  live: {str(err)[:160]}", flush=True)
        except Exception as err:  # the database away longer than the retries: next loop
            print(f"  live: {type(err).__name__}: {str(err)[:160]}", flush=True)
            time.sleep(0.5)

    declare([counts])
    while txlog.last_committed(PIPELINE) < plan.history:
        one(counts_only)
    declare([counts, lengths, firsts], start={"lengths": "history", "firsts": "history"})

    stop = threading.Event()

    def live() -> None:
        while not stop.is_set() and txlog.last_committed(PIPELINE) < plan.txids:
            one(transform)

    thread = threading.Thread(target=live, daemon=True)
    thread.start()
    starts, log = 0, workdir / f"{name}-fill.log"

    def start_fill() -> subprocess.Popen:
        nonlocal starts
        starts += 1
        return subprocess.Popen(
            [sys.executable, __file__, "--child", url, connect_url, str(folder), str(plan.chunk)],
            stdout=open(log, "a"),  # the child's
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    fill = start_fill()
    pending = list(plan.faults)
    why = ""

    def steps() -> int:  # the fill's steps so far, over all its processes
        done = log.read_text() if log.exists() else ""
        return sum(1 for line in done.splitlines() if line.startswith("txids "))

    try:
        while True:
            if pending and steps() >= pending[0][1]:
                kind, after = pending.pop(0)
                print(f"  fault {kind} after {after} fill step(s)", flush=True)
                if kind == "kill_fill" and fill.poll() is None:
                    os.killpg(fill.pid, signal.SIGKILL)
                    fill.wait()
                elif kind == "restart_log_postgres":
                    pg.restart(plan.down_for)
            if fill.poll() is not None:
                try:
                    with txlog.engine.connect() as conn:
                        still = filling_outputs(conn, PIPELINE)
                except Exception:  # the log is away: ask again
                    still = {"?": None}
                if not still:
                    if not thread.is_alive() or txlog.last_committed(PIPELINE) >= plan.txids:
                        break
                else:  # killed, or failed on an outage: Airflow's retry
                    time.sleep(1.0)
                    fill = start_fill()
            if time.monotonic() - started > BOUND:
                why = "did not heal and join in time"
                break
            time.sleep(0.1)
        thread.join(timeout=BOUND)
        stop.set()
    finally:
        if fill.poll() is None:
            os.killpg(fill.pid, signal.SIGKILL)
    spark.stop()

    # the truth, in plain Python over the committed txids' batches
    committed = [t for t in txlog.transactions(PIPELINE) if t.status.value == "committed"]
    truth_words, truth_lengths, truth_firsts = Counter(), Counter(), Counter()
    for t in committed:
        for p, (a, b) in t.metadata.items():
            for line in data[p][a:b]:
                truth_words.update(line.split())
                truth_lengths[len(line)] += 1
                truth_firsts.update(w[0] for w in line.split())
    with txlog.engine.connect() as conn:
        words = {k[0]: v for k, v in counts.items(conn).items()}
        got_lengths = {k[0]: v for k, v in lengths.items(conn).items()}
        got_firsts = {k[0]: v for k, v in firsts.items(conn).items()}
        joined = not filling_outputs(conn, PIPELINE)
    lost = sum(max(0, n - words.get(w, 0)) for w, n in truth_words.items())
    doubled = sum(max(0, n - truth_words.get(w, 0)) for w, n in words.items())
    exact = got_lengths == dict(truth_lengths) and got_firsts == dict(truth_firsts)
    if not why and not joined:
        why = "the fill did not join"
    if not why and len(committed) < plan.txids:
        why = f"only {len(committed)} of {plan.txids} txids committed"
    ok = not why and lost == 0 and doubled == 0 and exact
    txlog.engine.dispose()
    return RunResult(plan, ok, lost, doubled, exact, starts, time.monotonic() - started, why)


def run_suite(
    runs: int, seed: int, kinds: Sequence[str], pg, connect_url: str, work: Path
) -> list[RunResult]:
    """``runs`` runs from the master ``seed`` (the first one is the seed itself) on ``pg`` (a
    server of their own: they crash it) and the Spark Connect server at ``connect_url``."""
    drawn = random.Random(seed)
    results = []
    for run_seed in [seed] + [drawn.randrange(10**6) for _ in range(1, runs)]:
        plan = plan_run(run_seed, kinds)
        print(f"run seed {run_seed}: {plan}", flush=True)
        result = run_one(plan, pg, connect_url, work)
        results.append(result)
        print(
            f"  {'ok' if result.ok else 'FAILED'}: lost {result.lost}, doubled "
            f"{result.doubled}, fill exact {result.fill_exact}, fill processes "
            f"{result.fill_starts}, {result.seconds:.0f} s {result.why}",
            flush=True,
        )
        if not result.ok:
            print((work / f"r{run_seed}-fill.log").read_text()[-3000:])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        return child(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from txn_testing.postgres import EmbeddedPostgres
    from txn_testing.spark import SparkConnectServer

    print(f"fill chaos: {args.runs} run(s), master seed {args.seed}, faults {kinds}")
    with tempfile.TemporaryDirectory(prefix="txn-chaos-fill-") as tmp:
        work = Path(tmp)
        with EmbeddedPostgres(durable=True) as pg, SparkConnectServer(workdir=work / "c") as spark:
            results = run_suite(args.runs, args.seed, kinds, pg, spark.url, work)
    failed = [r for r in results if not r.ok]
    print(
        f"{len(results) - len(failed)}/{len(results)} runs ok; lost "
        f"{sum(r.lost for r in results)}, doubled {sum(r.doubled for r in results)}; fill "
        f"processes started {sum(r.fill_starts for r in results)} (one per kill and retry)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
