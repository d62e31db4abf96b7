"""The fill chaos tier: an output filled from history while the live pipeline commits, with the
fill's process killed and the log's Postgres crashed at seeded moments (issue 44).

No Airflow: a live loop in a thread of this process plays the pipeline (begin, process on Spark
Connect, commit, one txid at a time; a txid a fault failed replays), and the fill runs in a child
process (``--child``: ``fill_pipeline``, as the fill DAG's task runs it), started again after
each kill as Airflow's retry would. Per run, from its seed:

* the data (2 partitions of seeded lines), the history (6..12 txids committed before the
  declaration, counting words into ``counts``), the fill's chunk (1..3 txids), the live txids
  after the declaration (8..14);
* the declaration adds, with ``start="history"``, every kind of output at once: ``lengths`` (an
  opaque state: line lengths), ``firsts`` (a non-transactional one: words by first letter),
  ``lines`` (a global state: the line count) and two lake tables of every word stamped with its
  txid, ``words_delta`` (Delta) and ``words_iceberg`` (Iceberg, its catalog in the log's
  database);
* faults, each once the fill has logged a seeded number of steps (1..4, over all its processes),
  so it lands in the middle of the fill: ``kill_fill`` (SIGKILL its process group, a new one is
  started as Airflow's retry would) and ``restart_log_postgres`` (an immediate shutdown, the
  server down 1..3 s, then crash recovery: the UNLOGGED staging tables come back empty);
* faults inside a chunk, right after the fill's process made its Nth lake table commit (N drawn
  from the first two chunks' commits: the chunk's Postgres transaction is open, the tables are
  ahead of the log's progress): ``kill_in_lake_commit`` (the process SIGKILLs itself) and
  ``restart_log_in_lake_commit`` (the process stops itself, the log's Postgres is crashed and
  recovered under it, then it goes on and fails on its lost connection). Each goes to the next
  fill process started until it has happened.

The checks, in plain Python over the committed txids' batches (their lines from the data): the
fill joined; ``counts`` holds every word once (0 lost, 0 doubled: the live pipeline through the
faults), ``lengths``, ``firsts`` and ``lines`` equal their truth exactly, and each lake table
holds every (word, txid) of the committed txids once (lost and doubled count them too: the fill
through the faults, each txid applied once, in order). Every run prints its seed;
``--seed S --runs 1`` replays it.

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
STEP_FAULTS = ("kill_fill", "restart_log_postgres")
LAKE_FAULTS = ("kill_in_lake_commit", "restart_log_in_lake_commit")
"""Faults at the fill process's Nth lake table commit (inside a chunk's transaction)."""
FAULTS = STEP_FAULTS + LAKE_FAULTS
LAKE_FAULT_ENV = "TXN_CHAOS_FILL_LAKE_FAULT"
"""``kind:N``: the fill process faults right after its Nth lake table commit."""
SINKS = ("words_delta", "words_iceberg")
STALL = 150.0
"""Seconds without a new fill step (nor a fill process started) before a run counts as stuck:
a loaded machine slows every step (CI once took 36 s for a first chunk), a stuck fill makes none."""
BOUND = 900.0
"""Seconds a run may take in all to heal and join before it counts as not recovered."""


@dataclass(frozen=True)
class RunPlan:
    seed: int
    history: int
    live: int
    chunk: int
    faults: tuple[tuple[str, int], ...]
    """(kind, after how many of the fill's steps; for a lake fault, at which of its process's
    lake table commits)"""
    down_for: float

    @property
    def txids(self) -> int:
        return self.history + self.live


def plan_run(seed: int, kinds: Sequence[str] = FAULTS) -> RunPlan:
    rng = random.Random(seed)
    steps = [k for k in kinds if k in STEP_FAULTS]
    faults = tuple(sorted(((k, rng.randint(1, 4)) for k in steps), key=lambda f: f[1]))
    history, live, chunk = rng.randint(6, 12), rng.randint(8, 14), rng.randint(1, 3)
    down_for = round(rng.uniform(1.0, 3.0), 2)
    if any(k in LAKE_FAULTS for k in kinds):
        chunk = rng.randint(2, 4)  # more than one txid: a fault can fall inside a chunk
        commits = 2 * chunk * len(SINKS)  # the first two chunks' table commits
        faults += tuple((k, rng.randint(1, commits)) for k in kinds if k in LAKE_FAULTS)
    return RunPlan(seed, history, live, chunk, faults, down_for)


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
        "lines": batch.agg(F.count("*").alias("delta")),
        **{sink: words.select("word") for sink in SINKS},
    }


def counts_only(batch):  # the job before it
    return {"counts": transform(batch)["counts"]}


def outputs():
    from airflow_txn_provider.state import GlobalState, MapState

    return [
        MapState(PIPELINE, "counts", "transactional", keys={"word": "text"}),
        MapState(PIPELINE, "lengths", "opaque", keys={"n": "bigint"}),
        MapState(PIPELINE, "firsts", "non_transactional", keys={"letter": "text"}),
        GlobalState(PIPELINE, "lines"),
    ]


def lake_sinks(folder: Path, run: str):
    """The run's two lake tables (the Iceberg catalog: the log's database)."""
    from airflow_txn_provider.sinks import DeltaSink, IcebergSink

    delta, iceberg = SINKS
    return [
        DeltaSink(delta, table_uri=str(folder / run / "lake"), txid_column="txid"),
        IcebergSink(
            iceberg, table=f"chaos.{run}_words", warehouse=str(folder / "wh"), txid_column="txid"
        ),
    ]


def arm_lake_fault(spec: str) -> None:
    """In the fill's process: fault right after its Nth lake table commit (``kind:N``), inside
    the chunk's transaction, by wrapping each table format's commit."""
    from airflow_txn_provider.sinks.delta import DeltaLakeTable
    from airflow_txn_provider.sinks.iceberg import IcebergLakeTable

    kind, at = spec.split(":")
    made = [0]

    def wrap(cls) -> None:
        add = cls.add

        def add_then_fault(self, *args, **kwargs):
            version = add(self, *args, **kwargs)
            made[0] += 1
            if made[0] == int(at):
                print(f"lake fault {kind} at table commit {at} (txid {kwargs['txid']})", flush=True)
                stop = signal.SIGKILL if kind == "kill_in_lake_commit" else signal.SIGSTOP
                os.kill(os.getpid(), stop)  # SIGSTOP: the parent crashes the log, then SIGCONT
            return version

        cls.add = add_then_fault

    wrap(DeltaLakeTable)
    wrap(IcebergLakeTable)


def child(argv: Sequence[str]) -> int:
    """The fill's process: what the fill DAG's task runs."""
    from airflow_txn_provider.sinks.base import sink_from_spec
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.connect_sessions import connect_session
    from airflow_txn_provider.spark.fill import fill_pipeline
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

    url, connect, data, chunk, sinks = argv
    logging.basicConfig(level=logging.WARNING)
    if os.environ.get(LAKE_FAULT_ENV):
        arm_lake_fault(os.environ[LAKE_FAULT_ENV])
    txlog = TransactionLog.from_url(url, migrate=False)
    with connect_session(connect) as spark:
        report = fill_pipeline(
            txlog,
            PIPELINE,
            spark=spark,
            source=PartitionedParquetSource(data, PER_TXID),
            transforms=[transform],
            sinks=[sink_from_spec(spec) for spec in json.loads(sinks)],
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
    """One run on its own database of ``pg``; the live loop's Spark Connect session is this
    process's for the run only (the process's classic sessions stay classic)."""
    from airflow_txn_provider.spark.connect_sessions import connect_session

    with connect_session(connect_url) as spark:
        return _run(plan, pg, connect_url, workdir, spark)


def _run(plan: RunPlan, pg, connect_url: str, workdir: Path, spark) -> RunResult:
    from sqlalchemy import create_engine, text

    from airflow_txn_provider.log.fill_progress import filling_outputs
    from airflow_txn_provider.rules.exceptions import TxnError
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob, process_batch
    from airflow_txn_provider.transactions.commit import commit_registered
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from tests.spark_data import parquet_dataset

    started = time.monotonic()
    name = f"r{plan.seed}"
    db = f"fill_{plan.seed}"
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
    counts, lengths, firsts, total = outputs()
    sinks = lake_sinks(workdir, name)
    live_sinks: list = []  # the live processing's and commits' (none before the declaration)

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
            job_of = BatchJob(PIPELINE, e.txid, e.attempt, source, sinks=tuple(live_sinks))
            process_batch(spark, txlog, job_of, job)
            commit_registered(txlog, PIPELINE, e.txid, e.attempt, live_sinks)
        except TxnError as err:  # a crash failed it: it replays
            print(f"  live: {str(err)[:160]}", flush=True)
        except Exception as err:  # the database away longer than the retries: next loop
            print(f"  live: {type(err).__name__}: {str(err)[:160]}", flush=True)
            time.sleep(0.5)

    declare([counts])
    while txlog.last_committed(PIPELINE) < plan.history:
        one(counts_only)
    added = ["lengths", "firsts", "lines", *SINKS]
    declare([counts, lengths, firsts, total], sinks=sinks, start=dict.fromkeys(added, "history"))
    live_sinks[:] = sinks

    stop = threading.Event()

    def live() -> None:
        while not stop.is_set() and txlog.last_committed(PIPELINE) < plan.txids:
            one(transform)

    thread = threading.Thread(target=live, daemon=True)
    thread.start()
    starts, log = 0, workdir / f"{name}-fill.log"
    pending = [f for f in plan.faults if f[0] in STEP_FAULTS]
    in_chunk = [f for f in plan.faults if f[0] in LAKE_FAULTS]
    specs = json.dumps([sink.to_spec() for sink in sinks])

    def start_fill() -> subprocess.Popen:
        nonlocal starts
        starts += 1
        env = dict(os.environ)
        env.pop(LAKE_FAULT_ENV, None)
        if in_chunk:  # the next fault inside a chunk goes to this process, until it happened
            env[LAKE_FAULT_ENV] = f"{in_chunk[0][0]}:{in_chunk[0][1]}"
        argv = ["--child", url, connect_url, str(folder), str(plan.chunk), specs]
        return subprocess.Popen(
            [sys.executable, __file__, *argv],
            stdout=open(log, "a"),  # the child's
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    fill = start_fill()
    why = ""
    progress = (0, starts)  # fill steps logged, fill processes started
    progressed = time.monotonic()

    def logged() -> list[str]:  # the fill's lines so far, over all its processes
        return (log.read_text() if log.exists() else "").splitlines()

    def steps() -> int:
        return sum(1 for line in logged() if line.startswith("txids "))

    def in_chunk_fault_happened() -> bool:
        kind, at = in_chunk[0]
        return any(line.startswith(f"lake fault {kind} at table commit {at} ") for line in logged())

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
            if in_chunk and in_chunk_fault_happened():
                kind, at = in_chunk.pop(0)
                print(f"  fault {kind} at the fill's table commit {at}", flush=True)
                if kind == "restart_log_in_lake_commit":
                    _wait_stopped(fill.pid)
                    pg.restart(plan.down_for)  # under the stopped fill's open transaction
                    os.killpg(fill.pid, signal.SIGCONT)
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
            now = time.monotonic()
            if (steps(), starts) != progress:
                progress, progressed = (steps(), starts), now
            if now - progressed > STALL:
                why = f"stuck: no fill step for {STALL:.0f} s"
                break
            if now - started > BOUND:
                why = "did not heal and join in time"
                break
            time.sleep(0.1)
        thread.join(timeout=BOUND)
        stop.set()
    finally:
        if fill.poll() is None:
            os.killpg(fill.pid, signal.SIGCONT)
            os.killpg(fill.pid, signal.SIGKILL)
    if in_chunk and not why:
        why = f"the faults {in_chunk} never happened (the fill had fewer table commits)"

    # the truth, in plain Python over the committed txids' batches
    committed = [t for t in txlog.transactions(PIPELINE) if t.status.value == "committed"]
    truth_words, truth_lengths, truth_firsts = Counter(), Counter(), Counter()
    truth_lake: Counter = Counter()
    for t in committed:
        for p, (a, b) in t.metadata.items():
            for line in data[p][a:b]:
                truth_words.update(line.split())
                truth_lengths[len(line)] += 1
                truth_firsts.update(w[0] for w in line.split())
                truth_lake.update((w, t.txid) for w in line.split())
    with txlog.engine.connect() as conn:
        words = {k[0]: v for k, v in counts.items(conn).items()}
        got_lengths = {k[0]: v for k, v in lengths.items(conn).items()}
        got_firsts = {k[0]: v for k, v in firsts.items(conn).items()}
        got_lines = total.value(conn)
        joined = not filling_outputs(conn, PIPELINE)
    lost = sum(max(0, n - words.get(w, 0)) for w, n in truth_words.items())
    doubled = sum(max(0, n - truth_words.get(w, 0)) for w, n in words.items())
    exact = got_lengths == dict(truth_lengths) and got_firsts == dict(truth_firsts)
    exact = exact and got_lines == sum(truth_lengths.values())
    last = committed[-1].txid if committed else 0
    for sink in sinks:
        table = sink.read_as_of(PIPELINE, last, log_url=url)
        words_of, txids = table.column("word").to_pylist(), table.column("txid").to_pylist()
        got = Counter(zip(words_of, txids, strict=True))
        lost += sum((truth_lake - got).values())
        doubled += sum((got - truth_lake).values())
        if got != truth_lake:
            print(f"  {sink.name}: lost {truth_lake - got}, doubled {got - truth_lake}")
    if not why and not joined:
        why = "the fill did not join"
    if not why and len(committed) < plan.txids:
        why = f"only {len(committed)} of {plan.txids} txids committed"
    ok = not why and lost == 0 and doubled == 0 and exact
    txlog.engine.dispose()
    return RunResult(plan, ok, lost, doubled, exact, starts, time.monotonic() - started, why)


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until the process ``pid`` is stopped (its state ``T`` in ``/proc``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return  # gone
        if state in ("T", "t"):
            return
        time.sleep(0.05)


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
