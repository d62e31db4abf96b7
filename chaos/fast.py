"""The fast chaos tier: seeded faults against real processes, a real Postgres and Spark Connect.

No Airflow: a driver loop in this process plays its role for one pipeline per run. It registers
the pipeline (a transactional Parquet source whose batches are known in plain Python, word count
into a transactional map state), begins txids in the ``max_pending`` window, starts one real
worker process (:mod:`chaos.worker`, its own process group, forked from a warmed fork server as
Airflow forks a task process: :mod:`chaos.forked`) per begun attempt, which processes it
on Spark Connect under a lease, calls ``expire_leases`` every tick (what the failure sensor does),
re-begins failed txids in order and commits processed txids in order (``commit_registered``).

Faults, at seeded moments (a fault fires ``delay`` seconds after the ``spawn``-th worker process
of the run started; one at a commit point fires at the run's last commit if its moment has not
come by then, so a run that commits faster than its delays still meets it):

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

Every run also reports its re-emissions (attempts beyond a txid's first, from the log);
``--faults none`` runs without a fault, each of which fails if it re-emitted anything.

Usage: ``python chaos/fast.py --runs 200 --seed 2026 [--txids 4] [--faults a,b] [--sink delta]``.
Every run prints its own seed; ``--seed <run seed> --runs 1`` (with the same ``--txids``,
``--faults`` and ``--sink``) replays that run's plan: the first run of a suite uses the master
seed itself. The plan (data, window, faults, moments) is replayed exactly; the interleaving of
processes is the machine's.
Exits 1 if a run did not recover, lost or doubled a record.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: chaos/ and tests/ are packages of the repository
    sys.path.insert(0, str(ROOT))

from airflow_txn_provider.log.reads import TransactionInfo  # noqa: E402
from airflow_txn_provider.rules.coordinator import committable  # noqa: E402
from airflow_txn_provider.rules.exceptions import StagedOutputMismatchError, TxnError  # noqa: E402
from airflow_txn_provider.rules.records import PipelineView  # noqa: E402
from airflow_txn_provider.rules.vocabulary import BeginAction, TxStatus  # noqa: E402
from airflow_txn_provider.sinks import DeltaSink, IcebergSink, LakeSink, StagedFiles  # noqa: E402
from airflow_txn_provider.sources.landing import LandingDirectorySource  # noqa: E402
from airflow_txn_provider.sources.parquet import PartitionedParquetSource  # noqa: E402
from airflow_txn_provider.spark.job import LOG_URL_ENV  # noqa: E402
from airflow_txn_provider.state import MapState  # noqa: E402
from airflow_txn_provider.transactions.commit import commit_registered  # noqa: E402
from airflow_txn_provider.transactions.transaction_log import TransactionLog  # noqa: E402
from chaos.committer import TABLE_COMMITTED  # noqa: E402
from chaos.forked import ForkedProcess  # noqa: E402
from chaos.report import NO_FAULT, FaultResult, print_table, reemissions  # noqa: E402
from tests.spark_data import (  # noqa: E402
    lines_in_ranges,
    parquet_dataset,
    random_lines,
    word_counts,
    write_landing_file,
)
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

log = logging.getLogger("chaos.fast")

KILL = "kill_processing"
RESTART_LOG = "restart_log_postgres"
KILL_COMMITTER = "kill_committer"
KILL_BACKEND = "kill_backend"
FAIL_SINK = "fail_sink_commit"
FAULTS = (KILL, RESTART_LOG, KILL_BACKEND)
"""The faults of a run without a lake sink."""
SINK_FAULTS = (KILL, RESTART_LOG, KILL_COMMITTER, KILL_BACKEND, FAIL_SINK)
"""The faults of a run with a lake sink (``kill_committer`` needs a table commit to stop after,
``fail_sink_commit`` a second table)."""
BACKEND_POINTS = ("staging", "between_jobs", "processed", "commit")
"""Where ``kill_backend`` strikes: inside a worker's staging transaction (after its COPY),
between the two jobs of a txid (two-job runs only), after a txid recorded its output and before
its commit, inside the commit (after the states applied)."""
SINKS = ("none", "delta", "iceberg")
SINK_NAME = "words"
"""The lake sink's name (the key its output is recorded under: ``lake:words``)."""
SECOND_SINK_NAME = "words_b"
"""The second lake table of a ``fail_sink_commit`` run: its commit is the one that fails."""
LINES_PER_FILE = 25
"""Lines of one landing file (the opaque source of a ``fail_sink_commit`` run)."""
PRODUCE_EVERY = 0.6
"""Seconds between two landing files of a partition: batches start small and a replay that
comes later takes more (the opaque source changes on replay)."""
ICEBERG_NAMESPACE = "chaos"

LEASE = 5.0
"""Seconds a worker's lease lasts after each renewal (renewed every LEASE / 5 s): a starved
worker that misses renewals for this long is taken for dead."""
CLAIM = 20.0
"""Seconds a begun attempt's lease lasts before its worker takes it over: a worker started as
``python -m chaos.worker`` needed ~2 s to start here, and over 8 s beside an Airflow deployment
on the same two cores (CI), where a shorter claim expired every attempt before its worker
started (a replay storm, nothing committed). A replay whose claim ran out unstarted gets twice
as long (the log's own backoff, ``fencing.claim_timeout_for``): one CI run saw four such
expiries of one txid in a row."""
TICK = 0.25
"""Seconds between two rounds of the driver (expire leases, commit, begin)."""
BOUND = 180.0
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
    point: str = ""
    """``kill_backend``: where it strikes (:data:`BACKEND_POINTS`)."""

    def describe(self) -> str:
        what = f"{self.kind}@spawn{self.spawn}+{self.delay:.2f}s"
        if self.kind == KILL_BACKEND:
            return f"{self.kind}@{self.point}(spawn{self.spawn}+{self.delay:.2f}s)"
        return f"{what} down {self.down_for:.1f}s" if self.kind == RESTART_LOG else what


@dataclass(frozen=True)
class RunPlan:
    seed: int
    txids: int
    max_pending: int
    faults: tuple[FaultPlan, ...]
    jobs: int = 1
    """Processing jobs per txid (2: a txid staged by two jobs, then its output recorded)."""

    @property
    def fault_name(self) -> str:
        return " + ".join(sorted(f.kind for f in self.faults)) or NO_FAULT

    @property
    def opaque(self) -> bool:
        """A run with a failing sink commit reads an opaque source that grows meanwhile, so the
        failed txid's replay takes more records than the attempt the first table committed."""
        return any(f.kind == FAIL_SINK for f in self.faults)

    @property
    def tables(self) -> int:
        return 2 if self.opaque else 1

    def describe(self) -> str:
        faults = ", ".join(f.describe() for f in self.faults)
        shape = f" jobs={self.jobs}" if self.jobs > 1 else ""
        source = " source=opaque" if self.opaque else ""
        return f"txids={self.txids} max_pending={self.max_pending}{shape}{source} faults=[{faults}]"


def plan_run(seed: int, txids: int, kinds: Sequence[str], *, sink: str = "none") -> RunPlan:
    """The plan of the run with ``seed``: window size, jobs per txid (two only without a lake
    ``sink``: a txid with lake sinks has one job), one or two faults, their moments; none when
    ``kinds`` is ``[NO_FAULT]`` (a control run: it must re-emit nothing)."""
    if txids < 3:
        raise ValueError(f"a run needs at least 3 txids, got {txids}")
    rng = random.Random(seed)
    max_pending = rng.choice((3, 4))
    with_sink = sink != "none" or KILL_COMMITTER in kinds or FAIL_SINK in kinds
    jobs = 1 if with_sink else rng.choice((1, 2))
    faults = []
    for _ in range(0 if list(kinds) == [NO_FAULT] else rng.choice((1, 1, 2))):
        kind = rng.choice(list(kinds))
        spawn = rng.randint(1, txids - 2)  # later spawns exist: a kill always finds a victim
        if kind == RESTART_LOG:
            faults.append(
                FaultPlan(
                    kind, spawn, round(rng.uniform(0.0, 2.0), 2), round(rng.uniform(*DOWN_FOR), 1)
                )
            )
        elif kind == KILL_BACKEND:
            points = [p for p in BACKEND_POINTS if jobs == 2 or p != "between_jobs"]
            faults.append(
                FaultPlan(kind, spawn, round(rng.uniform(0.2, 2.5), 2), point=rng.choice(points))
            )
        else:  # kill_processing, kill_committer and fail_sink_commit
            faults.append(FaultPlan(kind, spawn, round(rng.uniform(0.2, 2.5), 2)))
    return RunPlan(seed, txids, max_pending, tuple(faults), jobs)


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


def make_sink(
    kind: str, run_dir: Path, workdir: Path, table: str, name: str = SINK_NAME
) -> LakeSink | None:
    """The run's lake sink ``name``: a Delta table in the run's folder, or the Iceberg table
    ``chaos.<table>`` (catalog: the log's database; warehouse: the suite's folder)."""
    if kind == "none":
        return None
    if kind == "delta":
        return DeltaSink(name, table_uri=str(run_dir / "lake" / table), txid_column="txid")
    if kind == "iceberg":
        return IcebergSink(
            name,
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
    popen: ForkedProcess
    started: float

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
        kind = "opaque" if plan.opaque else "transactional"
        self.state = MapState(self.pipeline, name, kind, keys={"word": "text"})
        self.sink = make_sink(infra.sink, self.dir, infra.workdir, name)
        self.sinks: tuple[LakeSink, ...] = () if self.sink is None else (self.sink,)
        if self.sink is not None and plan.tables == 2:
            second = make_sink(infra.sink, self.dir, infra.workdir, f"{name}_b", SECOND_SINK_NAME)
            assert second is not None
            self.sinks += (second,)
        self.lines = {
            p: random_lines(plan.seed * len(PARTITIONS) + i, plan.txids * LINES_PER_TXID)
            for i, p in enumerate(PARTITIONS)
        }
        self.unit = LINES_PER_FILE if plan.opaque else 1
        """Lines per source offset: a landing file's for the opaque source, else one."""
        self.produced = dict.fromkeys(PARTITIONS, 0)
        """Opaque source: landing files written so far, per partition."""
        self.produced_at = 0.0
        self.pause_files: dict[int, tuple[int, Path]] = {}
        """``kill_backend`` faults at a worker's pause point: fault index -> (spawn, file)."""
        self.source: PartitionedParquetSource | LandingDirectorySource | None = None
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
        self.killed_commits: dict[int, int] = {}
        """Txid -> attempt whose committer was killed after its (first) table commit."""

    # -- the driver ---------------------------------------------------------------------------

    def setup(self) -> None:
        self.dir.mkdir(parents=True)
        if self.plan.opaque:
            self.source = LandingDirectorySource(
                str(self.dir / "landing"),
                max_files_per_partition=LINES_PER_TXID // LINES_PER_FILE,
            )
            self._produce()
        else:
            data = parquet_dataset(self.dir / "data", self.lines, file_rows=50)
            self.source = PartitionedParquetSource(str(data), max_per_partition=LINES_PER_TXID)
        self.txlog.register_pipeline(
            self.pipeline, source_kind=self.state.kind, max_pending=self.plan.max_pending
        )
        self.state.create(self.txlog.engine)

    @property
    def files_per_partition(self) -> int:
        return len(self.lines[PARTITIONS[0]]) // LINES_PER_FILE

    def _produce(self) -> None:
        """Opaque source: the next landing file of every partition, every PRODUCE_EVERY s."""
        now = time.monotonic()
        if not self.plan.opaque or now < self.produced_at + PRODUCE_EVERY:
            return
        self.produced_at = now
        for p in PARTITIONS:
            seq = self.produced[p]
            if seq < self.files_per_partition:
                lines = self.lines[p][seq * LINES_PER_FILE : (seq + 1) * LINES_PER_FILE]
                write_landing_file(self.dir / "landing", p, seq, lines)
                self.produced[p] = seq + 1

    def _done(self) -> bool:
        """Every txid of the run committed: ``txids`` of them, or (opaque source) every landing
        file written and committed."""
        if not self.plan.opaque:
            return self.last_committed >= self.plan.txids
        ends = self._committed_ends()
        return all(ends.get(p, 0) >= self.files_per_partition for p in PARTITIONS)

    def _committed_ends(self) -> dict[str, int]:
        metadata = self.view.last_committed_metadata if self.view is not None else None
        return {p: int(r[1]) for p, r in dict(metadata or {}).items()}

    def line_ranges(self, metadata: Mapping[str, Any]) -> dict[str, list[int]]:
        """A txid's metadata in line offsets (a landing file holds ``LINES_PER_FILE``)."""
        return {p: [int(a) * self.unit, int(b) * self.unit] for p, (a, b) in metadata.items()}

    def drive(self) -> None:
        self.started = time.monotonic()
        deadline = self.started + BOUND
        while time.monotonic() < deadline:
            self._reap()
            self._produce()
            self._inject_due_faults()
            try:
                self._round()
            except Exception as err:  # the log gone past its outage timeout, or worse: counted
                self.events[f"driver error {type(err).__name__}"] += 1
                log.warning("pipeline=%s driver round failed: %s", self.pipeline, err)
            if self._done():
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
        expired = txlog.expire_leases(pipeline)
        if expired:  # which lease: a claim that ran out before its worker started, or renewals
            info = txlog.transaction(pipeline, expired[0])
            started = info is not None and info.lease_holder is not None
            self.events["lease expired" + ("" if started else " (worker never started)")] += 1
        view = self.view = txlog.view(pipeline)
        rec = committable(view)
        while rec is not None:
            due = self._due_fault(KILL_BACKEND, "processed", txid=rec.txid)
            if due is not None:  # its staged rows go with the crash recovery: it must replay
                self._kill_backend(due, f"after txid {rec.txid} attempt {rec.attempt} processed")
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
            if txid > self.plan.txids and not self.plan.opaque:
                break
            current = view.record(txid)
            if current is not None and current.status is not TxStatus.FAILED:
                continue
            emission = txlog.begin(pipeline, txid, self.source, claim_timeout=CLAIM)
            if emission.emitted:
                assert emission.attempt is not None
                if emission.action is not BeginAction.NEW:
                    self.events["replay"] += 1
                    if current is not None and current.metadata != emission.metadata:
                        self.events["replay took another batch (opaque)"] += 1
                self.max_begun = max(self.max_begun, txid)
                self._spawn(txid, emission.attempt)
            elif emission.no_data:
                if not self.plan.opaque:  # an opaque run's producer may not have written yet
                    self.events["no data (harness bug)"] += 1
                break
            elif emission.action in (BeginAction.WAIT_PREVIOUS, BeginAction.WAIT_WINDOW):
                break

    def _commit(self, txid: int, attempt: int) -> bool:
        """Commit ``(txid, attempt)`` in this process, or, when a ``kill_committer`` fault is
        due, in a child process killed between the table commit and the log's. Whether the txid
        committed. A due ``kill_backend`` at ``commit`` kills a backend inside the commit, after
        the states applied; a due ``fail_sink_commit`` deletes the second table's staged files
        first, so its table commit fails after the first table's."""
        due = self._due_fault(KILL_COMMITTER, txid=txid)
        if due is not None:
            return self._commit_and_kill(txid, attempt, due)
        failing = self._due_fault(FAIL_SINK, txid=txid)
        if failing is not None and len(self.sinks) == 2:
            self._lose_staged_files(failing, txid, attempt)
        with self._backend_killed_in_commit(txid, attempt):
            result = commit_registered(self.txlog, self.pipeline, txid, attempt, self.sinks)
        for sink in self.sinks:
            action = (result.details or {}).get(sink.output_key, {}).get("action")
            if action == "already_in_table":
                self.events["commit found its txid in the table"] += 1
            elif action == "replace":
                self.events["commit replaced another attempt's rows in the table"] += 1
        return True

    @contextlib.contextmanager
    def _backend_killed_in_commit(self, txid: int, attempt: int) -> Iterator[None]:
        due = self._due_fault(KILL_BACKEND, "commit", txid=txid)
        if due is None:
            yield
            return
        apply = MapState.apply

        def apply_then_kill(state: MapState, *args: Any, **kwargs: Any) -> Any:
            applied = apply(state, *args, **kwargs)
            if due in self.pending:  # once: the retried commit applies undisturbed
                self._kill_backend(due, f"inside the commit of txid {txid} attempt {attempt}")
            return applied

        MapState.apply = apply_then_kill  # type: ignore[method-assign]
        try:
            yield
        finally:
            MapState.apply = apply  # type: ignore[method-assign]

    def _lose_staged_files(self, entry: list[Any], txid: int, attempt: int) -> None:
        """The second table's staged files of ``(txid, attempt)`` are lost (a storage fault):
        its table commit then fails after the first table committed the attempt."""
        info = self.txlog.transaction(self.pipeline, txid)
        files = ((info.output if info is not None else None) or {}).get(self.sinks[1].output_key)
        if not files or not files.get("files") or info is None or info.attempt != attempt:
            return  # no rows for that table in this txid: the next commit
        StagedFiles.from_json(files).discard()
        self._fire(entry[0], f"lost table b's staged files of txid {txid} attempt {attempt}")
        self.pending.remove(entry)

    def _child_argv(self, module: str, txid: int, attempt: int, *options: str) -> list[str]:
        """The command line of a child (a worker or a committer) of ``(txid, attempt)``."""
        return [sys.executable, "-m", module, *self._child_options(txid, attempt, *options)]

    def _child_options(self, txid: int, attempt: int, *options: str) -> list[str]:
        """The options a child (a worker or a committer) of ``(txid, attempt)`` is given."""
        return [
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
        out = self.dir / f"worker-{self.spawned:02d}-txid{txid}-a{attempt}.log"
        argv = self._child_options(
            txid,
            attempt,
            "--source",
            json.dumps(self.source.to_spec()),
            "--spark-url",
            self.infra.spark_url,
            "--lease",
            str(LEASE),
        )
        for sink in self.sinks:
            argv += ["--sink", json.dumps(sink.to_spec())]
        if self.sinks:
            argv += ["--state", self.state.name]
        if self.plan.jobs > 1:
            argv += ["--jobs", str(self.plan.jobs)]
        argv += self._pause_options(self.spawned)
        # forked from a warmed server, in a process group of its own (a kill takes all of it)
        popen = ForkedProcess("chaos.worker", argv, env=self._child_env(), cwd=ROOT, out=out)
        self.spawn_times[self.spawned] = time.monotonic()
        self.workers.append(Worker(self.spawned, txid, attempt, popen, time.monotonic()))

    def _reap(self) -> None:
        for worker in [w for w in self.workers if not w.alive()]:
            code = worker.popen.poll()
            assert code is not None
            self.exits[code] += 1
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
            if fault.kind in (KILL_COMMITTER, FAIL_SINK) or (
                fault.kind == KILL_BACKEND and fault.point in ("processed", "commit")
            ):
                continue  # fires at the driver's next commit (see _round and _commit)
            if fault.kind == KILL_BACKEND:  # a worker's pause point
                self._kill_backend_at_pause(entry)
                continue
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

    def _pause_options(self, spawn: int) -> list[str]:
        """The pause options of the ``spawn``-th worker: the oldest unassigned ``kill_backend``
        fault at a worker's pause point whose target spawn has come is assigned to it."""
        for entry in self.pending:
            fault, target = entry
            if (
                fault.kind == KILL_BACKEND
                and fault.point in ("staging", "between_jobs")
                and id(entry) not in self.pause_files
                and target <= spawn
            ):
                file = self.dir / f"pause-{spawn:02d}-{fault.point}"
                self.pause_files[id(entry)] = (spawn, file)
                return ["--pause-at", fault.point, "--pause-file", str(file)]
        return []

    def _kill_backend_at_pause(self, entry: list[Any]) -> None:
        assigned = self.pause_files.get(id(entry))
        if assigned is None:
            return
        spawn, file = assigned
        if Path(f"{file}.paused").exists():
            worker = next((w for w in self.workers if w.spawn == spawn), None)
            where = f"txid {worker.txid} attempt {worker.attempt}" if worker else f"spawn {spawn}"
            self._kill_backend(entry, f"worker of {where} paused at {entry[0].point}")
            Path(f"{file}.go").touch()
            del self.pause_files[id(entry)]
        elif not any(w.spawn == spawn and w.alive() for w in self.workers):
            del self.pause_files[id(entry)]  # it ended before its pause point: the next worker
            entry[1] = max(entry[1], spawn + 1)

    def _kill_backend(self, entry: list[Any], where: str) -> None:
        """SIGKILL a client backend of the log's Postgres: crash recovery, server up."""
        pid = self.infra.pg.kill_backend()
        self._fire(entry[0], f"SIGKILL Postgres backend {pid}: {where}")
        self.pending.remove(entry)

    def _due_fault(
        self, kind: str, point: str | None = None, *, txid: int | None = None
    ) -> list[Any] | None:
        """The pending ``kind`` entry (at ``point``) whose moment has come, if any. At the commit
        of a run's last txid (``txid``) an entry whose worker started is due even if its moment
        has not come: no later commit would reach its point (a fast run outruns its delay)."""
        now = time.monotonic()
        last = txid is not None and not self.plan.opaque and txid >= self.plan.txids
        for entry in self.pending:
            fault, target = entry
            started = self.spawn_times.get(target)
            if (
                fault.kind == kind
                and (point is None or fault.point == point)
                and started is not None
                and (now >= started + fault.delay or last)
            ):
                if now < started + fault.delay:
                    self.events[f"{kind} at the last commit (before its moment)"] += 1
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
        sinks = [arg for sink in self.sinks for arg in ("--sink", json.dumps(sink.to_spec()))]
        argv = self._child_argv("chaos.committer", txid, attempt, *sinks)
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
                self.killed_commits[txid] = attempt
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
        if len(committed) < plan.txids and not plan.opaque:
            problems.append(f"{len(committed)}/{plan.txids} txids committed in {BOUND:.0f} s")
        ends = {p: 0 for p in PARTITIONS}
        for info in committed:
            for p in PARTITIONS:
                start, end = self.line_ranges(info.metadata).get(p, [ends[p], ends[p]])
                if start != ends[p]:
                    kind = "gap" if start > ends[p] else "overlap"
                    problems.append(f"{kind} in partition {p} at txid {info.txid}")
                ends[p] = end
        whole = len(committed) == plan.txids or plan.opaque
        if whole and any(ends[p] != len(self.lines[p]) for p in PARTITIONS):
            problems.append(f"batches end at {ends}, the source at {len(self.lines['0'])}")
        truth = word_counts(line for p in PARTITIONS for line in self.lines[p][: ends[p]])
        with self.txlog.engine.connect() as conn:
            got = {key[0]: int(value) for key, value in self.state.items(conn).items()}
        lost = sum(max(n - got.get(w, 0), 0) for w, n in truth.items())
        doubled = sum(max(n - truth.get(w, 0), 0) for w, n in got.items())
        lake: dict[str, object] = {}
        for i, sink in enumerate(self.sinks):
            figures = self._check_lake(sink, committed, problems, first=i == 0)
            if i == 0:
                lake = {**figures, "state_lost": lost, "state_doubled": doubled}
            else:  # the second table's own figures, beside the first's
                lake[f"table {sink.name}"] = {
                    k: figures.get(k) for k in ("lost", "doubled", "rows")
                }
            lost += int(figures["lost"])  # type: ignore[call-overload]
            doubled += int(figures["doubled"])  # type: ignore[call-overload]
        reemitted = reemissions(infos)
        if not plan.faults and reemitted:  # nothing failed on purpose: nothing may replay
            problems.append(f"{reemitted} attempt(s) re-emitted in a run without a fault")
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
            reemitted=reemitted,
        )

    def _check_lake(
        self,
        sink: LakeSink,
        committed: Sequence[TransactionInfo],
        problems: list[str],
        *,
        first: bool,
    ) -> dict[str, object]:
        """One of the run's lake tables checked by :func:`check_lake_table` (a killed
        committer stopped after the first table's commit: the others had none)."""
        return check_lake_table(
            sink,
            self.infra.pg.url,
            self.pipeline,
            self.lines,
            committed,
            problems,
            killed_commits=self.killed_commits if first else {},
            unit=self.unit,
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
    killed_commits: Mapping[int, int] | None = None,
    unit: int = 1,
) -> dict[str, object]:
    """A word-count pipeline's lake table against its log and the plain-Python word counts of
    each committed txid's batch: shared by the fast tier and the Airflow tier.

    :param sink: the pipeline's sink (its rows ``(word, delta, txid)``).
    :param log_url: the log's URL (an Iceberg sink's catalog defaults to the log's database).
    :param lines: the source's lines by partition; a committed txid's batch is
        ``lines_in_ranges(lines, metadata)``.
    :param committed: the pipeline's committed txids, in txid order.
    :param problems: what is wrong is appended here.
    :param killed_commits: txid -> attempt whose committer was killed after the table commit:
        the log's commit of that attempt must have found it in the table (``already_in_table``);
        a later attempt's (the txid failed meanwhile) must have replaced it (``replace``).
    :param unit: lines per offset of the metadata (a landing file's lines; 1: offsets are lines).

    Returns the figures (``lost`` and ``doubled`` in word occurrences, as the state's; ``rows``,
    ``table_txid``, ``pairs_missing``, ``pairs_twice``, ``staging_leftovers``). An unreadable
    table counts every committed occurrence lost.
    """
    last = committed[-1].txid if committed else 0
    truth = {
        (info.txid, word): n
        for info in committed
        for word, n in word_counts(
            lines_in_ranges(
                lines, {p: [a * unit, b * unit] for p, (a, b) in dict(info.metadata).items()}
            )
        ).items()
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
        held = version_of.get(txid)
        if commit.get("version") != held and not _same_rows(table, commit.get("version"), held):
            # (a Delta RESTORE that replaced txid + 1's attempt holds txid anew: same rows)
            problems.append(
                f"txid {txid}: the log recorded table version {commit.get('version')}, "
                f"the table has {version_of.get(txid)}"
            )
    attempts = {info.txid: info.attempt for info in committed}
    for txid, attempt in sorted((killed_commits or {}).items()):  # found in the table on retry
        if txid not in recorded:
            continue
        expected = "already_in_table" if attempts[txid] == attempt else "replace"
        if recorded[txid].get("action") != expected:
            problems.append(
                f"txid {txid}: its committer of attempt {attempt} was killed after the table "
                f"commit; the log's commit of attempt {attempts[txid]} did "
                f"{recorded[txid].get('action')!r}, not {expected!r}"
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
    first: int = 0,
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
    :param first: start at this run (0-based) of the suite's seeds: the rest of a suite that
        was stopped, with the same seeds.
    """
    known = faults_for(sink)
    faults = known if faults is None else tuple(faults)
    unknown = sorted(set(faults) - set(known)) if list(faults) != [NO_FAULT] else []
    if unknown or not faults:
        raise ValueError(f"unknown faults {unknown} with sink {sink!r}; known: {list(known)}")
    own_workdir = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="txn-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)  # the log's Postgres runs as user postgres
    seeds = run_seeds(seed, runs)[first:]
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
        for index, run_seed in enumerate(seeds, start=first):
            plan = plan_run(run_seed, txids, faults, sink=sink)
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
                f"lost {result.records_lost}, doubled {result.records_doubled}, "
                f"re-emitted {result.reemitted}{lake_summary(result)} "
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


def _same_rows(table: Any, version: Any, other: Any) -> bool:
    """Whether two versions of a lake table hold the same rows (a version that cannot be read:
    no)."""
    if version is None or other is None:
        return False
    try:
        rows = [sorted(map(str, table.read(v).to_pylist())) for v in (version, other)]
    except Exception:
        return False
    return rows[0] == rows[1]


def warm_up(spark_url: str, workdir: Path) -> float:
    """Run the word count once on the server (its first job compiles for ~15 s): no run pays it."""
    from airflow_txn_provider.spark.connect_sessions import connect_session
    from chaos.worker import load_transform

    started = time.monotonic()
    data = parquet_dataset(workdir / "warm-up", {"0": random_lines(0, LINES_PER_TXID)})
    source = PartitionedParquetSource(str(data), max_per_partition=LINES_PER_TXID)
    with connect_session(spark_url) as session:  # the process stays unmarked after it
        batch = source.read_batch(session, {"0": [0, LINES_PER_TXID]})
        load_transform()(batch).toArrow()
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
        help=f"comma-separated, from {','.join(SINK_FAULTS)} ({KILL_COMMITTER} needs a sink), "
        f"or {NO_FAULT} (runs without a fault: each must re-emit nothing); default: all of them "
        "the sink allows",
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="none",
        help="also write the word count into a lake table, and check it (default: none)",
    )
    parser.add_argument("--spark-url", default=None, help="use this Spark Connect server")
    parser.add_argument("--workdir", type=Path, default=None, help="keep everything here")
    parser.add_argument(
        "--first", type=int, default=0, help="start at this run (0-based): the rest of a suite"
    )
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
        first=args.first,
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
