"""The fast chaos tier: seeded faults against real processes, a real Postgres and Spark Connect.

No Airflow: a driver loop in this process plays its role for one pipeline per run. It registers
the pipeline (a transactional Parquet source whose batches are known in plain Python, word count
into a transactional map state), begins txids in the ``max_pending`` window, starts one real
worker process (:mod:`chaos.worker`, its own process group) per begun attempt, which processes it
on Spark Connect under a lease, calls ``expire_leases`` every tick (what the failure sensor does),
re-begins failed txids in order and commits processed txids in order (``commit_registered``).

Faults, at seeded moments (a fault fires ``delay`` seconds after the ``spawn``-th worker process
of the run started):

* ``kill_processing``: SIGKILL the process group of a live worker in the middle of its job (the
  ``spawn``-th one if still alive, else the newest live one, else the next one to start);
* ``restart_log_postgres``: stop the log's Postgres with an immediate shutdown (a crash), keep it
  down for a seeded 1-8 s, start it again (crash recovery; UNLOGGED staging tables come back
  empty).
* ``kill_committer`` (with a lake sink only): the driver's next commit after the moment runs in a
  child process (:mod:`chaos.committer`) that stops once the lake table's commit has returned,
  inside the log's open transaction; the driver SIGKILLs its process group there. The table
  holds the txid, the log does not: the driver's next commit of the txid must find it in the
  table and add nothing twice.

**Lake sinks** (``--sink delta|iceberg``): the word count also goes into a lake table, Delta
(``deltalake``, under the run's folder) or Iceberg (``pyiceberg``; its SQL catalog in the log's
Postgres, which ``restart_log_postgres`` crashes too; the warehouse under the suite's folder),
append mode with a ``txid`` column: the workers' Spark executors stage Parquet files per attempt,
each commit (``commit_registered(..., sinks)``) adds them in one table commit recording the txid.
Runs then draw from all three faults.

After each run, the checks: every txid committed within ``BOUND`` seconds, commits strictly
increasing (txid and time), nothing left in flight, the committed batches tile the source (no gap,
no overlap, up to its end), and the state equals the word counts of the source computed in plain
Python. A state count above the truth is a doubled record, below it a lost one (records are word
occurrences, the state's unit). With a lake sink, also the table: for every committed txid, the
table's rows of that txid are its batch's word counts computed in plain Python (a ``(txid,
word)`` row missing is its count lost, one there twice its count doubled; both add to the run's
lost and doubled, with the state's), the table's committed txid is the log's last, it holds one
commit per txid 1..N (each the version the log recorded for the txid), and reading it as of each
txid gives exactly the rows of txids 1..txid.

**Time to recover** (of one fault): from the moment the fault was injected to the moment every
txid that was in flight (begun, not committed) at that moment had committed; 0 when none was. A
run with several faults reports the longest. It includes the normal processing of those txids.

Usage: ``python chaos/fast.py --runs 200 --seed 2026 [--txids 4] [--faults a,b] [--sink delta]``.
Every run prints its own seed; ``--seed <run seed> --runs 1`` (with the same ``--txids``,
``--faults`` and ``--sink``) replays that run's plan: the first run of a suite uses the master
seed itself. The plan (data, window, faults, moments) is replayed exactly; the interleaving of
processes is the machine's.
Exits 1 if a run did not recover, lost or doubled a record.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: chaos/ and tests/ are packages of the repository
    sys.path.insert(0, str(ROOT))

from airflow_txn_provider.commit import commit_registered  # noqa: E402
from airflow_txn_provider.coordinator import (  # noqa: E402
    BeginAction,
    PipelineView,
    TxStatus,
    committable,
)
from airflow_txn_provider.exceptions import StagedOutputMismatchError, TxnError  # noqa: E402
from airflow_txn_provider.sinks import DeltaSink, IcebergSink, LakeSink  # noqa: E402
from airflow_txn_provider.spark.job import LOG_URL_ENV  # noqa: E402
from airflow_txn_provider.spark.sources import PartitionedParquetSource  # noqa: E402
from airflow_txn_provider.state import MapState  # noqa: E402
from airflow_txn_provider.transaction_log import TransactionInfo, TransactionLog  # noqa: E402
from chaos.committer import TABLE_COMMITTED  # noqa: E402
from chaos.report import FaultResult, print_table  # noqa: E402
from tests.spark_data import (  # noqa: E402
    lines_in_ranges,
    parquet_dataset,
    random_lines,
    word_counts,
)
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

log = logging.getLogger("chaos.fast")

KILL = "kill_processing"
RESTART_LOG = "restart_log_postgres"
KILL_COMMITTER = "kill_committer"
FAULTS = (KILL, RESTART_LOG)
"""The faults of a run without a lake sink."""
SINK_FAULTS = (KILL, RESTART_LOG, KILL_COMMITTER)
"""The faults of a run with a lake sink (``kill_committer`` needs a table commit to stop after)."""
SINKS = ("none", "delta", "iceberg")
SINK_NAME = "words"
"""The lake sink's name (the key its output is recorded under: ``lake:words``)."""
ICEBERG_NAMESPACE = "chaos"

LEASE = 3.0
"""Seconds a worker's lease lasts after each renewal (renewed every LEASE / 5 s)."""
CLAIM = 8.0
"""Seconds a begun attempt's lease lasts before its worker takes it over: a worker process needs
~2 s to start here, more on a loaded machine."""
TICK = 0.25
"""Seconds between two rounds of the driver (expire leases, commit, begin)."""
BOUND = 120.0
"""A run that has not committed every txid this many seconds after it started did not recover."""
OUTAGE_TIMEOUT = 60.0
"""Seconds every log call (driver and workers) waits out a database that is down."""
COMMITTER_TIMEOUT = OUTAGE_TIMEOUT + 60.0
"""Seconds the driver waits for a ``kill_committer`` child to reach the table commit."""
LINES_PER_TXID = 100
"""Lines of each partition in one txid's batch."""
PARTITIONS = ("0", "1")
DOWN_FOR = (1.0, 8.0)
"""Range of seconds the log's Postgres stays down."""


# -- the plan of a run: everything random, from its seed ------------------------------------------


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    spawn: int
    """The fault fires ``delay`` seconds after the ``spawn``-th worker process started (1-based)."""
    delay: float
    down_for: float = 0.0
    """``restart_log_postgres``: seconds the server stays down."""

    def describe(self) -> str:
        what = f"{self.kind}@spawn{self.spawn}+{self.delay:.2f}s"
        return f"{what} down {self.down_for:.1f}s" if self.kind == RESTART_LOG else what


@dataclass(frozen=True)
class RunPlan:
    seed: int
    txids: int
    max_pending: int
    faults: tuple[FaultPlan, ...]

    @property
    def fault_name(self) -> str:
        return " + ".join(sorted(f.kind for f in self.faults))

    def describe(self) -> str:
        faults = ", ".join(f.describe() for f in self.faults)
        return f"txids={self.txids} max_pending={self.max_pending} faults=[{faults}]"


def plan_run(seed: int, txids: int, kinds: Sequence[str]) -> RunPlan:
    """The plan of the run with ``seed``: window size, one or two faults, their moments."""
    if txids < 3:
        raise ValueError(f"a run needs at least 3 txids, got {txids}")
    rng = random.Random(seed)
    max_pending = rng.choice((3, 4))
    faults = []
    for _ in range(rng.choice((1, 1, 2))):
        kind = rng.choice(list(kinds))
        spawn = rng.randint(1, txids - 2)  # later spawns exist: a kill always finds a victim
        if kind == RESTART_LOG:
            faults.append(
                FaultPlan(
                    kind, spawn, round(rng.uniform(0.0, 2.0), 2), round(rng.uniform(*DOWN_FOR), 1)
                )
            )
        else:  # kill_processing and kill_committer
            faults.append(FaultPlan(kind, spawn, round(rng.uniform(0.2, 2.5), 2)))
    return RunPlan(seed, txids, max_pending, tuple(faults))


def faults_for(sink: str) -> tuple[str, ...]:
    """The faults runs draw from by default: ``kill_committer`` only with a lake sink."""
    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r}; known: {list(SINKS)}")
    return FAULTS if sink == "none" else SINK_FAULTS


def run_seeds(master: int, runs: int) -> list[int]:
    """The seeds of ``runs`` runs: the master seed first (so ``--seed S --runs 1`` replays any
    run), then 32-bit seeds drawn from it."""
    rng = random.Random(master)
    seeds = [master]
    while len(seeds) < runs:
        seed = rng.getrandbits(32)
        if seed not in seeds:
            seeds.append(seed)
    return seeds[:runs]


# -- the shared infrastructure ---------------------------------------------------------------------


@dataclass
class Infra:
    """One durable Postgres for the log (restarted by faults), one Spark Connect server."""

    pg: EmbeddedPostgres
    spark_url: str
    workdir: Path
    txlog: TransactionLog
    sink: str = "none"
    """``none``, ``delta`` or ``iceberg``: the lake sink every run's pipeline also writes."""


def make_sink(kind: str, run_dir: Path, workdir: Path, table: str) -> LakeSink | None:
    """The run's lake sink: a Delta table in the run's folder, or the Iceberg table
    ``chaos.<table>`` (catalog: the log's database; warehouse: the suite's folder)."""
    if kind == "none":
        return None
    if kind == "delta":
        return DeltaSink(SINK_NAME, table_uri=str(run_dir / "lake" / table), txid_column="txid")
    if kind == "iceberg":
        return IcebergSink(
            SINK_NAME,
            table=f"{ICEBERG_NAMESPACE}.{table}",
            warehouse=str(workdir / "warehouse"),
            txid_column="txid",
        )
    raise ValueError(f"unknown sink {kind!r}; known: {list(SINKS)}")


@dataclass
class Worker:
    spawn: int
    txid: int
    attempt: int
    popen: subprocess.Popen[bytes]
    started: float
    out: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class FiredFault:
    plan: FaultPlan
    at: float
    in_flight: tuple[int, ...]
    what: str


class ChaosRun:
    """One run: a fresh pipeline and data set, the driver loop, the faults, then the checks."""

    def __init__(self, infra: Infra, plan: RunPlan, index: int) -> None:
        self.infra = infra
        self.plan = plan
        self.txlog = infra.txlog
        self.dir = infra.workdir / f"run-{index:03d}-{plan.seed}"
        self.pipeline = f"chaos-{index:03d}-{plan.seed}"
        name = f"chaos_{index:03d}_{plan.seed % 16**8:08x}"
        self.state = MapState(self.pipeline, name, "transactional", keys={"word": "text"})
        self.sink = make_sink(infra.sink, self.dir, infra.workdir, name)
        self.sinks: tuple[LakeSink, ...] = () if self.sink is None else (self.sink,)
        self.lines = {
            p: random_lines(plan.seed * len(PARTITIONS) + i, plan.txids * LINES_PER_TXID)
            for i, p in enumerate(PARTITIONS)
        }
        self.source: PartitionedParquetSource | None = None
        self.view: PipelineView | None = None
        """The driver's latest view of the pipeline."""
        self.workers: list[Worker] = []
        self.spawned = 0
        self.spawn_times: dict[int, float] = {}
        self.last_committed = 0
        self.max_begun = 0
        self.committed_at: dict[int, float] = {}
        self.pending = [[f, f.spawn] for f in plan.faults]  # [plan, current target spawn]
        self.fired: list[FiredFault] = []
        self.restarting: threading.Thread | None = None
        self.restart_errors: list[str] = []
        self.events: Counter[str] = Counter()
        self.exits: Counter[int] = Counter()
        self.started = 0.0
        self.commit_children = 0
        self.killed_commits: set[int] = set()
        """Txids whose committer was killed after its table commit."""

    # -- the driver ---------------------------------------------------------------------------

    def setup(self) -> None:
        self.dir.mkdir(parents=True)
        data = parquet_dataset(self.dir / "data", self.lines, file_rows=50)
        self.source = PartitionedParquetSource(str(data), max_per_partition=LINES_PER_TXID)
        self.txlog.register_pipeline(
            self.pipeline, source_kind="transactional", max_pending=self.plan.max_pending
        )
        self.state.create(self.txlog.engine)

    def drive(self) -> None:
        self.started = time.monotonic()
        deadline = self.started + BOUND
        while time.monotonic() < deadline:
            self._reap()
            self._inject_due_faults()
            try:
                self._round()
            except Exception as err:  # the log gone past its outage timeout, or worse: counted
                self.events[f"driver error {type(err).__name__}"] += 1
                log.warning("pipeline=%s driver round failed: %s", self.pipeline, err)
            if self.last_committed >= self.plan.txids:
                break
            time.sleep(TICK)
        for pending, _target in self.pending:  # the run ended before these could fire
            if pending.kind == RESTART_LOG:  # a crash after the last commit: state must survive
                self._restart_log(pending)
            else:
                self.events[f"{pending.kind} not injected"] += 1
        self.pending.clear()
        if self.restarting is not None:
            self.restarting.join()
        self._stop_workers()

    def _round(self) -> None:
        txlog, pipeline = self.txlog, self.pipeline
        if txlog.expire_leases(pipeline):
            self.events["lease expired"] += 1
        view = self.view = txlog.view(pipeline)
        rec = committable(view)
        while rec is not None:
            try:
                if not self._commit(rec.txid, rec.attempt):
                    break  # its committer was killed: the next round commits it again
            except StagedOutputMismatchError:  # staged rows lost in a crash: the txid replays
                self.events["commit refused: staged rows lost"] += 1
                break
            except TxnError as err:
                self.events[f"commit refused: {type(err).__name__}"] += 1
                log.warning("pipeline=%s commit refused: %s", pipeline, err)
                break
            self.committed_at[rec.txid] = time.monotonic()
            self.last_committed = rec.txid
            view = self.view = txlog.view(pipeline)
            rec = committable(view)
        assert self.source is not None
        for txid in view.window:
            if txid > self.plan.txids:
                break
            current = view.record(txid)
            if current is not None and current.status is not TxStatus.FAILED:
                continue
            emission = txlog.begin(pipeline, txid, self.source, claim_timeout=CLAIM)
            if emission.emitted:
                assert emission.attempt is not None
                if emission.action is not BeginAction.NEW:
                    self.events["replay"] += 1
                self.max_begun = max(self.max_begun, txid)
                self._spawn(txid, emission.attempt)
            elif emission.no_data:
                self.events["no data (harness bug)"] += 1
                break
            elif emission.action in (BeginAction.WAIT_PREVIOUS, BeginAction.WAIT_WINDOW):
                break

    def _commit(self, txid: int, attempt: int) -> bool:
        """Commit ``(txid, attempt)`` in this process, or, when a ``kill_committer`` fault is
        due, in a child process killed between the table commit and the log's. Whether the txid
        committed."""
        due = self._due_committer_fault()
        if due is not None:
            return self._commit_and_kill(txid, attempt, due)
        result = commit_registered(self.txlog, self.pipeline, txid, attempt, self.sinks)
        for sink in self.sinks:
            action = (result.details or {}).get(sink.output_key, {}).get("action")
            if action == "already_in_table":
                self.events["commit found its txid in the table"] += 1
        return True

    def _child_argv(self, module: str, txid: int, attempt: int, *options: str) -> list[str]:
        """The command line of a child (a worker or a committer) of ``(txid, attempt)``."""
        return [
            sys.executable,
            "-m",
            module,
            "--pipeline",
            self.pipeline,
            "--txid",
            str(txid),
            "--attempt",
            str(attempt),
            "--outage-timeout",
            str(OUTAGE_TIMEOUT),
            *options,
        ]

    def _spawn(self, txid: int, attempt: int) -> None:
        assert self.source is not None
        self.spawned += 1
        out = open(self.dir / f"worker-{self.spawned:02d}-txid{txid}-a{attempt}.log", "wb")
        env = self._child_env()
        argv = self._child_argv(
            "chaos.worker",
            txid,
            attempt,
            "--source",
            json.dumps(self.source.to_spec()),
            "--spark-url",
            self.infra.spark_url,
            "--lease",
            str(LEASE),
        )
        if self.sink is not None:
            argv += ["--sink", json.dumps(self.sink.to_spec()), "--state", self.state.name]
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes all of it
        )
        self.spawn_times[self.spawned] = time.monotonic()
        self.workers.append(Worker(self.spawned, txid, attempt, popen, time.monotonic(), out))

    def _reap(self) -> None:
        for worker in [w for w in self.workers if not w.alive()]:
            self.exits[int(worker.popen.returncode)] += 1
            worker.out.close()
            self.workers.remove(worker)

    def _stop_workers(self, grace: float = 5.0) -> None:
        """Give the workers ``grace`` seconds to exit on their own, then kill what is left."""
        deadline = time.monotonic() + grace
        while any(w.alive() for w in self.workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        for worker in self.workers:
            if worker.alive():
                self.events["worker left running at the end"] += 1
                _kill_group(worker.popen.pid)
            worker.popen.wait()
        self._reap()

    # -- faults -------------------------------------------------------------------------------

    def _inject_due_faults(self) -> None:
        now = time.monotonic()
        for entry in list(self.pending):
            fault, target = entry
            started = self.spawn_times.get(target)
            if started is None or now < started + fault.delay:
                continue
            if fault.kind == KILL_COMMITTER:
                continue  # fires at the driver's next commit (see _commit)
            if fault.kind == RESTART_LOG:
                if self.restarting is not None and self.restarting.is_alive():
                    continue  # one outage at a time: fire when the server is back
                self._restart_log(fault)
                self.pending.remove(entry)
            else:
                live = self._working()
                victim = next((w for w in live if w.spawn == target), None)
                if victim is None and live:
                    victim = max(live, key=lambda w: w.spawn)
                if victim is None:  # nothing runs now: the next worker to start
                    entry[1] = max(target, self.spawned) + 1
                    continue
                self._fire(fault, f"SIGKILL worker txid {victim.txid} attempt {victim.attempt}")
                _kill_group(victim.popen.pid)
                self.pending.remove(entry)

    def _due_committer_fault(self) -> list[Any] | None:
        """The pending ``kill_committer`` entry whose moment has come, if any."""
        now = time.monotonic()
        for entry in self.pending:
            fault, target = entry
            started = self.spawn_times.get(target)
            if (
                fault.kind == KILL_COMMITTER
                and started is not None
                and now >= started + fault.delay
            ):
                return entry
        return None

    def _commit_and_kill(self, txid: int, attempt: int, entry: list[Any]) -> bool:
        """Commit in a :mod:`chaos.committer` child; SIGKILL it once its table commit returned.
        Whether the txid committed (only if the child never reached a table commit)."""
        assert self.sink is not None
        fault: FaultPlan = entry[0]
        self.commit_children += 1
        err = open(
            self.dir / f"committer-{self.commit_children:02d}-txid{txid}-a{attempt}.log", "wb"
        )
        argv = self._child_argv(
            "chaos.committer", txid, attempt, "--sink", json.dumps(self.sink.to_spec())
        )
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        assert popen.stdout is not None
        message: dict[str, Any] = {}
        deadline = time.monotonic() + COMMITTER_TIMEOUT
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([popen.stdout], [], [], 0.2)
                if not ready:
                    self._inject_due_faults()  # a log outage may be due while it commits
                    continue
                line = popen.stdout.readline()
                if not line:
                    break  # it exited
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not its report: a library's print
                if TABLE_COMMITTED in message or "committed" in message:
                    break
            if TABLE_COMMITTED in message:
                done = message[TABLE_COMMITTED]
                self._fire(
                    fault,
                    f"SIGKILL committer of txid {txid} attempt {attempt} after its table commit "
                    f"({done.get('action')}, version {done.get('version')}), before the log's",
                )
                _kill_group(popen.pid)
                self.pending.remove(entry)
                self.killed_commits.add(txid)
                return False
            if "committed" not in message:  # stuck past the deadline, or exited without a report
                _kill_group(popen.pid)
            rc = popen.wait()
            if rc == 0 and "committed" in message:  # e.g. the txid had committed already
                self.events["kill_committer: commit without a table commit"] += 1
                return True  # the fault stays pending: the next commit
            self.events[f"kill_committer: committer exited {rc}"] += 1
            return False
        finally:
            if popen.poll() is None:
                _kill_group(popen.pid)
            popen.wait()
            popen.stdout.close()
            err.close()

    def _child_env(self) -> dict[str, str]:
        return {
            **os.environ,
            LOG_URL_ENV: self.infra.pg.url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }

    def _working(self) -> list[Worker]:
        """Live workers, those of a current processing attempt only if there are any (a worker
        whose attempt was failed is on its way out: killing it tests nothing)."""
        live = [w for w in self.workers if w.alive()]
        view = self.view

        def current(w: Worker) -> bool:
            rec = view.record(w.txid) if view is not None else None
            return (
                rec is not None and rec.attempt == w.attempt and rec.status is TxStatus.PROCESSING
            )

        return [w for w in live if current(w)] or live

    def _fire(self, fault: FaultPlan, what: str) -> None:
        in_flight = tuple(range(self.last_committed + 1, self.max_begun + 1))
        self.fired.append(FiredFault(fault, time.monotonic(), in_flight, what))
        log.warning("pipeline=%s fault %s: %s", self.pipeline, fault.describe(), what)

    def _restart_log(self, fault: FaultPlan) -> None:
        pg = self.infra.pg
        if self.restarting is not None:
            self.restarting.join()
        self._fire(fault, f"log Postgres down {fault.down_for:.1f}s")
        pg.halt(mode="immediate")

        def come_back() -> None:
            time.sleep(fault.down_for)
            try:
                pg.start()
            except Exception as err:  # reported with the run: it cannot recover without it
                self.restart_errors.append(str(err))

        self.restarting = threading.Thread(target=come_back, name="log-postgres-restart")
        self.restarting.start()

    # -- the checks ---------------------------------------------------------------------------

    def check(self) -> FaultResult:
        plan, problems = self.plan, list(self.restart_errors)
        infos = self.txlog.transactions(self.pipeline)
        committed = [i for i in infos if i.status is TxStatus.COMMITTED]
        left = [
            f"txid {i.txid} {i.status.value}" for i in infos if i.status is not TxStatus.COMMITTED
        ]
        if left:
            problems.append(f"in flight: {', '.join(left)}")
        if [i.txid for i in committed] != list(range(1, len(committed) + 1)):
            problems.append(f"committed txids {[i.txid for i in committed]}")
        times = [i.committed_at for i in committed]
        if any(b is None or a is None or b <= a for a, b in itertools.pairwise(times)):
            problems.append("commits not strictly increasing in time")
        if len(committed) < plan.txids:
            problems.append(f"{len(committed)}/{plan.txids} txids committed in {BOUND:.0f} s")
        ends = {p: 0 for p in PARTITIONS}
        for info in committed:
            for p in PARTITIONS:
                start, end = info.metadata[p]
                if start != ends[p]:
                    kind = "gap" if start > ends[p] else "overlap"
                    problems.append(f"{kind} in partition {p} at txid {info.txid}")
                ends[p] = end
        if len(committed) == plan.txids and any(ends[p] != len(self.lines[p]) for p in PARTITIONS):
            problems.append(f"batches end at {ends}, the source at {len(self.lines['0'])}")
        truth = word_counts(line for p in PARTITIONS for line in self.lines[p][: ends[p]])
        with self.txlog.engine.connect() as conn:
            got = {key[0]: int(value) for key, value in self.state.items(conn).items()}
        lost = sum(max(n - got.get(w, 0), 0) for w, n in truth.items())
        doubled = sum(max(n - truth.get(w, 0), 0) for w, n in got.items())
        lake: dict[str, object] = {}
        if self.sink is not None:
            lake = self._check_lake(committed, problems)
            lake["state_lost"], lake["state_doubled"] = lost, doubled
            lost += int(lake["lost"])  # type: ignore[call-overload]
            doubled += int(lake["doubled"])  # type: ignore[call-overload]
        recovered = not problems
        ttr = None
        if recovered:
            ttr = max(
                (
                    max((self.committed_at[t] for t in f.in_flight), default=f.at) - f.at
                    for f in self.fired
                ),
                default=0.0,
            )
        detail = "; ".join(
            [
                plan.describe(),
                *(f"{f.what} (in flight {list(f.in_flight)})" for f in self.fired),
                *problems,
                *([f"lake {lake}"] if lake else []),
                f"events {dict(self.events)}",
                f"worker exits {dict(self.exits)}",
            ]
        )
        return FaultResult(
            plan.fault_name,
            plan.seed,
            recovered,
            ttr,
            lost,
            doubled,
            detail,
            extra={
                "seconds": time.monotonic() - self.started,
                "events": dict(self.events),
                **({"lake": lake} if lake else {}),
            },
        )

    def _check_lake(
        self, committed: Sequence[TransactionInfo], problems: list[str]
    ) -> dict[str, object]:
        """The run's lake table checked by :func:`check_lake_table`."""
        assert self.sink is not None
        return check_lake_table(
            self.sink,
            self.infra.pg.url,
            self.pipeline,
            self.lines,
            committed,
            problems,
            killed_commits=self.killed_commits,
        )

    def execute(self) -> FaultResult:
        self.setup()
        try:
            self.drive()
        finally:
            self._stop_workers(grace=0.0)
            if self.restarting is not None:
                self.restarting.join()
        return self.check()


def check_lake_table(
    sink: LakeSink,
    log_url: str,
    pipeline: str,
    lines: Mapping[str, Sequence[str]],
    committed: Sequence[TransactionInfo],
    problems: list[str],
    *,
    killed_commits: Collection[int] = (),
) -> dict[str, object]:
    """A word-count pipeline's lake table against its log and the plain-Python word counts of
    each committed txid's batch: shared by the fast tier and the Airflow tier.

    :param sink: the pipeline's sink (its rows ``(word, delta, txid)``).
    :param log_url: the log's URL (an Iceberg sink's catalog defaults to the log's database).
    :param lines: the source's lines by partition; a committed txid's batch is
        ``lines_in_ranges(lines, metadata)``.
    :param committed: the pipeline's committed txids, in txid order.
    :param problems: what is wrong is appended here.
    :param killed_commits: txids whose committer was killed after the table commit: their log
        commit must have found the txid in the table (``already_in_table``).

    Returns the figures (``lost`` and ``doubled`` in word occurrences, as the state's; ``rows``,
    ``table_txid``, ``pairs_missing``, ``pairs_twice``, ``staging_leftovers``). An unreadable
    table counts every committed occurrence lost.
    """
    last = committed[-1].txid if committed else 0
    truth = {
        (info.txid, word): n
        for info in committed
        for word, n in word_counts(lines_in_ranges(lines, info.metadata)).items()
    }
    figures: dict[str, object] = {"lost": sum(truth.values()), "doubled": 0}
    try:
        table = sink.open(log_url)
        table_txid = table.committed_txid(pipeline)
        versions = table.versions(pipeline)
        newest = table.read(versions[-1][1]) if versions else None
    except Exception as err:  # no table, or files it references are gone: all lost
        problems.append(f"lake table unreadable: {type(err).__name__}: {err}")
        return figures
    if table_txid != last:
        problems.append(f"lake table holds txid {table_txid}, the log committed {last}")
    if [t for t, _ in versions] != list(range(1, last + 1)):
        problems.append(f"lake table commits of txids {[t for t, _ in versions]}")
    version_of = dict(versions)
    recorded = {  # what the log's commit recorded of the table commit, by txid
        info.txid: ((info.output or {}).get(sink.output_key) or {}).get("commit") or {}
        for info in committed
    }
    for txid, commit in recorded.items():  # the version the log recorded is the table's
        if commit.get("version") != version_of.get(txid):
            problems.append(
                f"txid {txid}: the log recorded table version {commit.get('version')}, "
                f"the table has {version_of.get(txid)}"
            )
    for txid in sorted(set(killed_commits) & set(recorded)):  # found in the table on retry
        if recorded[txid].get("action") != "already_in_table":
            problems.append(
                f"txid {txid}: its committer was killed after the table commit, yet the log's "
                f"commit did {recorded[txid].get('action')!r}"
            )
    rows = [] if newest is None else newest.to_pylist()
    got: dict[tuple[int, str], list[int]] = {}
    for row in rows:
        got.setdefault((row["txid"], row["word"]), []).append(int(row["delta"]))
    lost = sum(max(n - sum(got.get(key, [])), 0) for key, n in truth.items())
    doubled = sum(max(sum(deltas) - truth.get(key, 0), 0) for key, deltas in got.items())
    missing = sum(1 for key in truth if key not in got)
    twice = sum(1 for deltas in got.values() if len(deltas) > 1)
    stray = sorted({t for t, _ in got} - set(range(1, last + 1)), key=str)
    if stray:
        problems.append(f"lake rows of txids {stray} the log did not commit")
    everything = Counter((row["txid"], row["word"], row["delta"]) for row in rows)
    for txid, version in versions:  # "as of txid": exactly the rows of txids 1..txid
        try:
            as_of = Counter(
                (r["txid"], r["word"], r["delta"]) for r in table.read(version).to_pylist()
            )
        except Exception as err:
            problems.append(f"lake table as of txid {txid} unreadable: {err}")
            continue
        expected = Counter({k: n for k, n in everything.items() if k[0] <= txid})
        if as_of != expected:
            problems.append(f"lake table as of txid {txid} is not the rows of txids 1..{txid}")
    figures.update(
        lost=lost,
        doubled=doubled,
        rows=len(rows),
        pairs_missing=missing,
        pairs_twice=twice,
        table_txid=table_txid,
        staging_leftovers=staging_leftovers(sink, pipeline, committed),
    )
    return figures


def staging_leftovers(sink: LakeSink, pipeline: str, committed: Sequence[TransactionInfo]) -> int:
    """Staging directories of committed txids besides the one the table holds (garbage, not
    data: killed workers' Spark jobs may still write after the commit's cleanup)."""
    count = 0
    for info in committed:
        kept = ((info.output or {}).get(sink.output_key) or {}).get("directory")
        root = Path(sink.txid_dir(pipeline, info.txid))
        if root.is_dir():
            count += sum(1 for d in root.iterdir() if d.is_dir() and str(d) != kept)
    return count


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the suite -----------------------------------------------------------------------------------


def run_suite(
    runs: int,
    seed: int,
    *,
    txids: int = 4,
    faults: Sequence[str] | None = None,
    sink: str = "none",
    spark_url: str | None = None,
    workdir: Path | None = None,
    progress: Callable[[str], None] = print,
    stop_after_failures: int = 5,
) -> list[FaultResult]:
    """Run ``runs`` seeded runs and return their results (one per run).

    :param seed: the master seed; run ``i``'s seed is ``run_seeds(seed, runs)[i]``.
    :param txids: txids per run.
    :param faults: the fault kinds runs draw from (``None``: :func:`faults_for` the sink).
    :param sink: ``none``, ``delta`` or ``iceberg``: the lake sink every run's pipeline also
        writes, and checks.
    :param spark_url: a running Spark Connect server (``sc://127.0.0.1:PORT``); one is started
        (``local[2]``) if ``None``.
    :param workdir: where data sets, worker logs and the servers live; a temporary folder if
        ``None`` (removed when every run passed).
    :param progress: called with one line per run.
    :param stop_after_failures: stop the suite after this many failed runs in a row (a broken
        environment, e.g. the library's code changing under a long suite, fails every run after
        it, two minutes each); the results so far are returned. ``0``: never stop.
    """
    known = faults_for(sink)
    faults = known if faults is None else tuple(faults)
    unknown = sorted(set(faults) - set(known))
    if unknown or not faults:
        raise ValueError(f"unknown faults {unknown} with sink {sink!r}; known: {list(known)}")
    own_workdir = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="txn-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)  # the log's Postgres runs as user postgres
    seeds = run_seeds(seed, runs)
    progress(
        f"chaos fast tier: master seed {seed}, {runs} runs, {txids} txids each, sink {sink}, "
        f"faults {','.join(faults)}; logs in {workdir}"
    )
    results: list[FaultResult] = []
    handler = _log_to(workdir / "chaos.log")
    with _servers(workdir, spark_url) as (pg, url):
        txlog = TransactionLog.from_url(pg.url, outage_timeout=OUTAGE_TIMEOUT)
        infra = Infra(pg, url, workdir, txlog, sink)
        progress(f"Spark Connect warm-up: {warm_up(url, workdir):.1f} s")
        for index, run_seed in enumerate(seeds):
            plan = plan_run(run_seed, txids, faults)
            started = time.monotonic()
            try:
                result = ChaosRun(infra, plan, index).execute()
            except Exception as err:  # the harness itself broke: a failed run, not a crash
                log.exception("run %s (seed %s) broke", index, run_seed)
                result = FaultResult(
                    plan.fault_name, run_seed, False, None, 0, 0, f"{plan.describe()}; {err!r}"
                )
            results.append(result)
            outcome = (
                f"recovered in {result.seconds_to_recover:.1f} s"
                if result.seconds_to_recover is not None
                else "NOT RECOVERED"
            )
            progress(
                f"[{index + 1:>3}/{runs}] seed {run_seed} {plan.describe()} -> {outcome}, "
                f"lost {result.records_lost}, doubled {result.records_doubled}"
                f"{lake_summary(result)} "
                f"({time.monotonic() - started:.1f} s){'' if result.ok else '  FAILED'}"
            )
            streak = len(results) - max((i + 1 for i, r in enumerate(results) if r.ok), default=0)
            if stop_after_failures and streak >= stop_after_failures:
                progress(f"stopped: {streak} runs failed in a row; logs in {workdir}")
                break
        txlog.engine.dispose()
    logging.getLogger().removeHandler(handler)
    handler.close()
    if own_workdir and all(r.ok for r in results):
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def lake_summary(result: FaultResult) -> str:
    """`` (table: N rows to txid T, lost L, doubled D)``: the lake check's own figures."""
    lake = result.extra.get("lake")
    if not isinstance(lake, dict):
        return ""
    if "rows" not in lake:
        return " (table unreadable)"
    return (
        f" (table: {lake['rows']} rows to txid {lake['table_txid']}, lost {lake['lost']}, "
        f"doubled {lake['doubled']})"
    )


def warm_up(spark_url: str, workdir: Path) -> float:
    """Run the word count once on the server (its first job compiles for ~15 s): no run pays it."""
    from pyspark.sql import SparkSession

    from chaos.worker import CONNECT_MODE_ENV, load_transform

    started = time.monotonic()
    saved = {name: os.environ.get(name) for name in CONNECT_MODE_ENV}
    data = parquet_dataset(workdir / "warm-up", {"0": random_lines(0, LINES_PER_TXID)})
    source = PartitionedParquetSource(str(data), max_per_partition=LINES_PER_TXID)
    session = SparkSession.builder.remote(spark_url).create()
    try:
        batch = source.read_batch(session, {"0": [0, LINES_PER_TXID]})
        load_transform()(batch).toArrow()
    finally:
        session.stop()
        for name, value in saved.items():  # a remote session marks the process: undo it
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return time.monotonic() - started


class _servers:
    """The log's durable Postgres and (unless given) a Spark Connect server, stopped on exit."""

    def __init__(self, workdir: Path, spark_url: str | None) -> None:
        self.workdir, self.spark_url = workdir, spark_url
        self.pg = EmbeddedPostgres(datadir=workdir / "pg", durable=True)
        self.spark: Any = None

    def __enter__(self) -> tuple[EmbeddedPostgres, str]:
        self.pg.start()
        try:
            url = self.spark_url
            if url is None:
                from txn_testing.spark import SparkConnectServer

                self.spark = SparkConnectServer(workdir=self.workdir / "connect").start()
                url = self.spark.url
        except BaseException:
            self.pg.stop()
            raise
        return self.pg, url

    def __exit__(self, *exc: object) -> None:
        try:
            if self.spark is not None:
                self.spark.stop()
        finally:
            self.pg.halt(mode="fast")


def _log_to(path: Path) -> logging.Handler:
    """Send this process's log records to ``path`` (returns the handler, to remove it)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("pyiceberg.io").setLevel(logging.WARNING)  # "Defaulting to PyArrow FileIO"
    return handler


def _quiet_console() -> None:
    """No log record on the console: one line per run is the output. The Spark servers' helpers
    import Airflow, whose logging setup prints every record to stdout; import them first, with
    Airflow's home out of ``~/airflow``, then drop the console handlers."""
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="txn-chaos-airflow-home-"))
    import txn_testing.spark  # noqa: F401

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            root.removeHandler(handler)


def summary_seconds(results: Sequence[FaultResult]) -> str:
    seconds = [float(r.extra.get("seconds", 0.0)) for r in results]  # type: ignore[arg-type]
    return f"median {statistics.median(seconds):.1f} s per run" if seconds else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="master seed (random if omitted)")
    parser.add_argument("--txids", type=int, default=4, help="txids per run (>= 3)")
    parser.add_argument(
        "--faults",
        default=None,
        help=f"comma-separated, from {','.join(SINK_FAULTS)} ({KILL_COMMITTER} needs a sink); "
        "default: all of them the sink allows",
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="none",
        help="also write the word count into a lake table, and check it (default: none)",
    )
    parser.add_argument("--spark-url", default=None, help="use this Spark Connect server")
    parser.add_argument("--workdir", type=Path, default=None, help="keep everything here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    faults = None if args.faults is None else [f for f in args.faults.split(",") if f]
    _quiet_console()
    started = time.monotonic()
    results = run_suite(
        args.runs,
        seed,
        txids=args.txids,
        faults=faults,
        sink=args.sink,
        spark_url=args.spark_url,
        workdir=args.workdir,
        progress=lambda line: print(line, flush=True),
    )
    wall = time.monotonic() - started
    print()
    print_table(
        results,
        title=f"Fast chaos tier: {len(results)} runs, master seed {seed}, {args.txids} txids per "
        f"run, sink {args.sink}, wall time {wall / 60:.1f} min ({summary_seconds(results)})",
    )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
