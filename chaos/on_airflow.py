"""The chaos suite on a real Airflow: one fault per run, at a seeded moment, then the pipeline
must heal by itself.

One deployment serves every run: Airflow's scheduler (LocalExecutor), dag-processor, triggerer
and api-server on their own durable Postgres (the metadata database), a second durable Postgres
for the transaction log, and a Spark Connect server, all on 127.0.0.1. Each run has its own
pipeline (a word count over 2 Parquet partitions, max_pending 4, ``TXIDS`` txids) and is unpaused
alone; a fault is injected once a txid is processing (plus a seeded delay), and then nobody
touches anything. The run recovered if every txid committed within ``BOUND`` seconds, commits
went strictly in txid order, the committed batches tile the data, nothing is left in flight, and
the state equals word counts computed in plain Python from the data.

The faults (``FAULTS``): ``kill_processing`` (a processing task SIGKILLed mid-job),
``kill_spark_connect`` (the Spark Connect server SIGKILLed, back 5 s later),
``restart_log_postgres`` (the log's Postgres crashed, immediate stop, for 15-25 s),
``restart_metadata_postgres`` (Airflow's metadata Postgres crashed for 10-20 s), ``stop_api_server``
(stopped for 30 s), ``kill_scheduler`` and ``kill_triggerer`` (SIGKILLed with their children, back
3 s later), ``cascade_herd`` (three txids fail once each, late), ``duplicate_task`` (a txid's
attempt processed a second time beside its task) and ``kill_log_backend``: one client backend of the
log's Postgres SIGKILLed, as the OOM killer does
(:meth:`txn_testing.postgres.EmbeddedPostgres.kill_backend`, the backend drawn from the run's seed),
at a seeded moment: while a txid processes, or once a txid's output is recorded and waits for its
commit (its staged rows then are what crash recovery loses). The server stays up, but the postmaster
resets every connection and runs crash recovery, which empties every UNLOGGED table: the staged rows
of every txid in flight are gone, with no restart for a clock to tell. Each txid whose staged rows
were lost must be found so by content (the counts its jobs recorded) and replay, never commit a
partial or empty batch. Last, ``none``: a run with no fault at all, the control run.

Every run reports its re-emissions (attempts beyond a txid's first, from the log); the control
run fails if it has any (a spurious replay: issue 46).

Time to recover: from the fault to the commit of the last txid that was in flight at the fault
(that txid's ``committed_at``, the log's clock, which is this machine's).

**Lake sinks** (``--sink delta|iceberg``; ``none``, the default, runs as before): every run's
pipeline also writes its word count into a lake table of its own, append mode with a ``txid``
column: a Delta table under the suite's folder, or the Iceberg table ``chaos.<run>`` (its SQL
catalog in the log's database, which ``restart_log_postgres`` crashes too and whose connections
``kill_log_backend`` resets; the warehouse under the suite's folder). The processing task's Spark
Connect job stages the rows as Parquet, the commit adds them in one table commit recording the txid.
The same faults, at the same moments (same seeds); after each run the table is checked too, with the
fast tier's :func:`chaos.fast.check_lake_table`: each committed txid's ``(txid, word, count)`` rows
exactly once and equal to the plain-Python counts of its batch (missing occurrences add to the run's
lost, extra ones to its doubled, with the state's), the table's committed txid is the log's last,
its commits are txids 1..N (each the version the log recorded), reading it as of each txid gives
exactly the rows of txids 1..txid. A fault given as ``fault@delta`` (or ``@iceberg``) runs with that
sink whatever ``--sink`` says: one deployment may mix runs with and without a table.

    python chaos/on_airflow.py --seed 7 --faults kill_processing,kill_scheduler --repeat 2
    python chaos/on_airflow.py --seed 2026 --sink iceberg
    python chaos/on_airflow.py --seed 2026 --faults kill_processing,kill_processing@delta
    python chaos/on_airflow.py --seed 2026 --faults kill_log_backend --sink delta
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.python import UTC

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages
    sys.path.insert(0, str(ROOT))

from chaos.report import NO_FAULT, FaultResult, print_table, reemissions  # noqa: E402

if TYPE_CHECKING:
    from airflow_txn_provider.sinks import LakeSink

TXIDS = 8
BATCH = 20
"""Lines per partition per txid (2 partitions)."""
BOUND = 420.0
"""Seconds a run may take to commit every txid after its fault."""

FAULTS = (
    "kill_processing",
    "kill_spark_connect",
    "restart_log_postgres",
    "restart_metadata_postgres",
    "stop_api_server",
    "kill_scheduler",
    "kill_triggerer",
    "cascade_herd",
    "duplicate_task",
    "kill_log_backend",  # appended: the runs of the faults above keep their seeds
    NO_FAULT,  # the control run: nothing injected, nothing may be re-emitted
)
"""Every fault the suite knows, in the order the table lists them."""
SINKS = ("none", "delta", "iceberg")
"""``--sink``: the lake table every run's pipeline also writes (``none``: only the map state)."""
OWN_POSTGRES = ("restart_log_postgres", "restart_metadata_postgres", "kill_log_backend")
"""The faults that crash a Postgres server of the deployment, or one of its backends."""
RUN_PREFIX = {"none": "chaos", "delta": "delta", "iceberg": "ice"}
"""A run's pipeline is ``<prefix>_<fault>_<round>``, by its sink."""

_PID = re.compile(r"pid (\d+)\)")


@dataclass
class Deployment:
    """What the runs share: two Postgres servers, Spark Connect and Airflow.

    ``log_pg`` and ``meta_pg`` are the servers the faults crash (:data:`OWN_POSTGRES`): ``None``
    on a deployment that lends its Postgres to no fault (the test suite's shared one, on which CI
    makes its run)."""

    log_pg: Any | None
    meta_pg: Any | None
    connect: Any
    stack: Any
    log_url: str
    workdir: Path

    def api(self) -> Any:
        return self.stack.client()


@dataclass(frozen=True)
class Plan:
    fault: str
    seed: int
    name: str
    data: dict[str, list[str]]
    sink: str = "none"
    """The lake table the run's pipeline also writes: ``none``, ``delta`` or ``iceberg``."""
    label: str = ""
    """The run's row in the table: the fault, ``fault@sink`` when asked for so."""


def plan_runs(faults: Sequence[str], seed: int, repeat: int = 1, sink: str = "none") -> list[Plan]:
    """Runs to make: each fault ``repeat`` times, each with a seed drawn from ``seed``.

    Each run's pipeline also writes a lake table of kind ``sink``; a fault given as
    ``fault@delta`` or ``fault@iceberg`` has that sink whatever ``sink`` says (one suite may
    mix runs with and without a table), and is its own row of the table. The seeds do not
    depend on the sinks."""
    from airflow_txn_provider.state import MapState
    from tests.spark_data import random_lines

    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r}; known: {', '.join(SINKS)}")
    rng = random.Random(seed)
    plans = []
    for round_ in range(repeat):
        for entry in faults:
            fault, _, own = entry.partition("@")
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
            if own and own not in SINKS:
                raise ValueError(f"unknown sink {own!r} in {entry!r}; known: {', '.join(SINKS)}")
            kind = own or sink
            run_seed = rng.randrange(1 << 30)
            data = {p: random_lines(run_seed + i, TXIDS * BATCH) for i, p in enumerate("01")}
            # One name per fault, round and sink (a state's name has at most 40 characters).
            name = f"{RUN_PREFIX[kind]}_{fault}_{round_}"
            plan = Plan(fault, run_seed, name, data, kind, entry)
            MapState(name, state_name(plan))  # a name the DAG can use, or ValueError now
            plans.append(plan)
    return plans


def lake_sink(workdir: Path, plan: Plan) -> LakeSink | None:
    """The run's lake sink (the fast tier's :func:`chaos.fast.make_sink`): the Delta table
    ``<workdir>/runs/<run>/lake/<run>``, or the Iceberg table ``chaos.<run>`` in the log's
    database, its warehouse ``<workdir>/warehouse``; ``None`` without a sink."""
    from chaos.fast import make_sink

    return make_sink(plan.sink, workdir / "runs" / plan.name, workdir, plan.name)


def state_name(plan: Plan) -> str:
    """The run's map state (``chaos/dags/chaos_words.py`` names it so)."""
    return f"{plan.name}_counts"


def job_path(workdir: Path, plan: Plan) -> Path:
    """The run's job file: ``spark_jobs/word_count.py``, or with a lake sink :func:`lake_job`'s."""
    if plan.sink == "none":
        return ROOT / "spark_jobs" / "word_count.py"
    return workdir / "jobs" / plan.name / "word_count.py"


def lake_job(workdir: Path, plan: Plan, sink: LakeSink) -> Path:
    """Write the run's job file with a lake sink: ``spark_jobs/word_count.py``'s word count
    returned for both outputs, ``{<state>: counts, <sink>: counts}`` (one DataFrame serves one
    output only). Its stem stays ``word_count``: the task ids are the ones without a sink."""
    path = job_path(workdir, plan)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'''"""Written by chaos/on_airflow.py: the word count of spark_jobs/word_count.py for two
outputs, the map state {state_name(plan)!r} and the lake sink {sink.name!r}."""

from airflow_txn_provider.operators.spark_runner import load_job_module

_word_count = load_job_module({str(ROOT / "spark_jobs" / "word_count.py")!r})


def transform(batch):
    counts = _word_count.transform(batch)
    return {{{state_name(plan)!r}: counts, {sink.name!r}: counts}}
'''
    )
    return path


def prepare_runs(plans: Sequence[Plan], workdir: Path) -> list[dict[str, Any]]:
    """Write each run's data (and, with a lake sink, its job file) under ``workdir``; return what
    ``chaos/dags/chaos_words.py`` reads from ``$TXN_CHAOS_RUNS`` to build one DAG per run."""
    from tests.spark_data import parquet_dataset

    runs = []
    for plan in plans:
        data = parquet_dataset(workdir / "data" / plan.name, plan.data)
        run: dict[str, Any] = {"name": plan.name, "data": str(data), "batch": BATCH}
        table = lake_sink(workdir, plan)
        if table is not None:
            run.update(sink=table.to_spec(), job=str(lake_job(workdir, plan, table)))
        runs.append(run)
    return runs


def start(plans: Sequence[Plan], workdir: Path) -> Deployment:
    """Start the deployment with one DAG per planned run (all paused); a run with a lake sink
    writes its own table."""
    from sqlalchemy import create_engine, text

    from txn_testing.airflow import AirflowStack, txn_log_connection_env
    from txn_testing.postgres import EmbeddedPostgres
    from txn_testing.spark import SparkConnectServer

    started: list[Any] = []  # stopped again if the deployment does not come up
    try:
        # Durable: a crash of either server keeps every commit it acknowledged.
        log_pg = EmbeddedPostgres(workdir / "log-pg", durable=True).start()
        started.append(log_pg)
        meta_pg = EmbeddedPostgres(workdir / "meta-pg", durable=True).start()
        started.append(meta_pg)
        admin = create_engine(meta_pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE airflow"))
        admin.dispose()
        meta_url = meta_pg.url.rsplit("/", 1)[0] + "/airflow"
        connect = SparkConnectServer(workdir=workdir / "connect").start()
        started.append(connect)
        env = {
            "TXN_CHAOS_RUNS": json.dumps(prepare_runs(plans, workdir)),
            **txn_log_connection_env("txn_log_default", log_pg.url),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect.url,
        }
        stack = AirflowStack(workdir / "airflow", meta_url, ROOT / "chaos" / "dags", env=env)
        started.append(stack)
        stack.start()
        deployment = Deployment(log_pg, meta_pg, connect, stack, log_pg.url, workdir)
        api = deployment.api()
        for plan in plans:
            api.wait_for_dag(plan.name)
    except BaseException:
        for thing in reversed(started):
            try:
                thing.stop()
            except Exception as err:  # stop the rest all the same
                print(f"stopping {type(thing).__name__} failed: {err}", flush=True)
        raise
    return deployment


def stop(deployment: Deployment) -> None:
    deployment.stack.stop()
    deployment.connect.stop()
    for pg in (deployment.meta_pg, deployment.log_pg):
        if pg is not None:
            pg.stop()


# -- faults ------------------------------------------------------------------------------------


def _processing_holder(txlog: Any, pipeline: str, at_least: int) -> tuple[int, int] | None:
    """A txid >= ``at_least`` whose processing task holds its lease now: (txid, task pid)."""
    for info in txlog.transactions(pipeline):
        if info.txid >= at_least and info.status.value == "processing" and info.lease_holder:
            match = _PID.search(info.lease_holder)
            if match:
                return info.txid, int(match.group(1))
    return None


def _staged_txids(txlog: Any, pipeline: str) -> list[int]:
    """Txids whose output is recorded and waits for its commit: their staged rows are in the log's
    UNLOGGED staging tables now (a txid still processing may have staged some too)."""
    return [i.txid for i in txlog.transactions(pipeline) if i.status.value == "processed"]


def _wait(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # a service this run broke on purpose: ask again
            value = None
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def inject(
    deployment: Deployment, plan: Plan, txlog: Any, rng: random.Random
) -> tuple[str, datetime]:
    """Wait for the fault's moment, cause it; return what was done and when it began."""
    d, name = deployment, plan.name
    if plan.fault == NO_FAULT:
        return "no fault", datetime.now(UTC)
    if plan.fault == "cascade_herd":
        # Three txids fail once each, late: each failure cascades over the txids in flight
        # behind it, and each cascade re-queues max_pending runs at once.
        txids = sorted(rng.sample(range(2, TXIDS), 3))
        d.api().set_variable(
            f"txn_inject_failure__{name}", ",".join(f"{t}@{rng.uniform(2, 4):.1f}" for t in txids)
        )
        return f"txids {txids} fail once each, late", datetime.now(UTC)
    # Drawn once, not at each poll: the draws after it (the delay, the fault's own) depend on the
    # seed only, not on how many polls the moment took.
    at_least = rng.randint(1, 3)
    if plan.fault == "kill_log_backend":
        return _kill_log_backend(d, plan, txlog, rng, at_least)
    txid, pid = _wait(lambda: _processing_holder(txlog, name, at_least), 240, "a processing task")
    time.sleep(rng.uniform(0, 0.5))  # processing a batch takes about a second
    began = datetime.now(UTC)
    if plan.fault == "duplicate_task":
        attempt = txlog.transaction(name, txid).attempt
        staged = _process_again(d, plan, txid, attempt, txlog)
        return (
            f"txid {txid} attempt {attempt} processed a second time beside its task: {staged}",
            began,
        )
    if plan.fault == "kill_processing":
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL of txid {txid}'s processing task (pid {pid})", began
    if plan.fault == "kill_spark_connect":
        d.connect.kill()
        time.sleep(5)
        d.connect.start()
        return (
            f"Spark Connect server SIGKILLed while txid {txid} processed, back 5 s later",
            began,
        )
    if plan.fault == "restart_log_postgres":
        down = rng.uniform(15, 25)
        assert d.log_pg is not None  # run_one checked
        d.log_pg.restart(down)
        return (f"the log's Postgres crashed (immediate stop) for {down:.0f} s", began)
    if plan.fault == "restart_metadata_postgres":
        down = rng.uniform(10, 20)
        assert d.meta_pg is not None  # run_one checked
        d.meta_pg.restart(down)
        return (f"Airflow's metadata Postgres crashed (immediate stop) for {down:.0f} s", began)
    if plan.fault == "stop_api_server":
        d.stack.kill("api-server", signal.SIGTERM)
        time.sleep(30)
        d.stack.start_component("api-server")
        return ("api-server stopped for 30 s", began)
    component = {"kill_scheduler": "scheduler", "kill_triggerer": "triggerer"}[plan.fault]
    killed = d.stack.kill(component)
    time.sleep(3)
    d.stack.start_component(component)
    return (
        f"{component} SIGKILLed with its {len(killed)} child processes at txid {txid}, "
        "back 3 s later",
        began,
    )


def _process_again(d: Deployment, plan: Plan, txid: int, attempt: int, log: Any) -> str:
    """Run ``(txid, attempt)``'s processing once more, in this process, while its task runs: what
    Airflow does when it runs one task instance twice (apache/airflow#23520)."""
    from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob

    source = PartitionedParquetSource(str(d.workdir / "data" / plan.name), max_per_partition=BATCH)
    sink = lake_sink(d.workdir, plan)  # with a sink, a second staging of the attempt's files
    job = BatchJob(plan.name, txid, attempt, source, sinks=() if sink is None else (sink,))
    outcome = SparkConnectRunner(str(job_path(d.workdir, plan)), url=d.connect.url).run(job, log)
    return outcome.status


def _kill_log_backend(
    d: Deployment, plan: Plan, log: Any, rng: random.Random, at_least: int
) -> tuple[str, datetime]:
    """SIGKILL one client backend of the log's Postgres: the server stays up, resets every
    connection and runs crash recovery, which empties the UNLOGGED staging tables.

    The moment is drawn from the seed: ``processing`` (as ``restart_log_postgres``: a txid >=
    ``at_least`` processing, plus a delay) or ``processed``: the first txid >= ``at_least``
    seen with its output recorded and its commit not yet made, i.e. with staged rows that crash
    recovery then loses (a window of a few hundred ms: polled every 50 ms). If no txid is seen so
    before only the last one is left to commit, the kill comes then, and says so. The backend is
    the one at the drawn place among the client backends' pids (how many there are depends on
    the moment, so the draw comes first)."""
    name = plan.name
    phase = rng.choice(("processing", "processed"))
    pick = rng.random()
    delay = rng.uniform(0, 0.5)
    if phase == "processing":
        txid, _ = _wait(lambda: _processing_holder(log, name, at_least), 240, "a processing task")
        time.sleep(delay)
        moment = f"txid {txid} processing (txid >= {at_least}), +{delay:.2f} s"
    else:  # no delay: the window is short, and the kill should land in it
        found, seen = _wait(
            lambda: _processed_moment(log, name, at_least), 240, "a processed txid", poll=0.05
        )
        moment = (
            f"txid {seen[0]} processed, its commit not yet made (txid >= {at_least})"
            if found
            else f"no txid >= {at_least} seen processed before its commit: killed with "
            f"txid {TXIDS} left"
        )
    began = datetime.now(UTC)
    assert d.log_pg is not None  # run_one checked
    at_stake = seen if phase == "processed" else _staged_txids(log, name)
    for _ in range(5):  # a backend may close between the listing and the kill: list again
        backends = d.log_pg.client_backends()
        chosen = backends[int(pick * len(backends))] if backends else None
        try:
            killed = d.log_pg.kill_backend(chosen)
            break
        except ProcessLookupError:
            continue
    else:
        raise RuntimeError("every backend picked was gone before its kill")
    which = "one it opened" if chosen is None else f"draw {pick:.3f} of {len(backends)} backends"
    return (
        f"SIGKILL of the log's Postgres backend pid {killed} ({which}) at the {phase} moment: "
        f"{moment}; crash recovery emptied the staging tables (txids processed, staged rows "
        f"at stake: {at_stake or 'none'})",
        began,
    )


def _processed_moment(txlog: Any, pipeline: str, at_least: int) -> tuple[bool, list[int]] | None:
    """``(True, txids)``: txids >= ``at_least`` (and <= ``TXIDS``) whose output is recorded and
    waits for its commit; ``(False, [])`` once only the last txid is left to commit (no such
    moment was seen); ``None``: neither yet."""
    infos = [i for i in txlog.transactions(pipeline) if i.txid <= TXIDS]
    staged = [i.txid for i in infos if i.txid >= at_least and i.status.value == "processed"]
    if staged:
        return True, staged
    if sum(i.status.value == "committed" for i in infos) >= TXIDS - 1:
        return False, []
    return None


# -- one run -----------------------------------------------------------------------------------


def run_one(deployment: Deployment, plan: Plan) -> FaultResult:
    """Unpause the run's pipeline, cause its fault, wait for it to heal, check it against ground
    truth."""
    from airflow_txn_provider.state import MapState
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from chaos.fast import check_lake_table
    from tests.spark_data import word_counts

    if plan.fault in OWN_POSTGRES and (deployment.log_pg is None or deployment.meta_pg is None):
        raise ValueError(f"{plan.label}: this deployment lends no Postgres server to a fault")
    rng = random.Random(plan.seed)
    txlog = TransactionLog.from_url(deployment.log_url)
    restarts_before = dict(deployment.stack.restarts)
    deployment.api().unpause(plan.name)
    detail = ""
    try:
        detail, fault_at = inject(deployment, plan, txlog, rng)
        in_flight = [t.txid for t in txlog.transactions(plan.name) if t.status.value != "committed"]
        if plan.fault == "cascade_herd":  # the moment of the first own failure
            fault_at = _wait(lambda: _first_failure(txlog, plan.name), 240, "the first failure")
            in_flight = list(range(1, TXIDS + 1))
        _wait(lambda: txlog.last_committed(plan.name) >= TXIDS, BOUND, "every txid to commit")
        recovered = True
    except TimeoutError as err:
        recovered, fault_at, in_flight = False, datetime.now(UTC), []
        detail = f"{detail}; {err}"
        print(_snapshot(deployment, plan, txlog), flush=True)
    finally:
        try:
            deployment.api().pause(plan.name)
        except Exception:  # the api-server may be the fault; the run is judged all the same
            pass

    infos = txlog.transactions(plan.name)
    committed = [i for i in infos if i.status.value == "committed"]
    problems = []
    if [i.txid for i in committed] != list(range(1, len(committed) + 1)):
        problems.append("commits are not txids 1..n")
    stamps = [i.committed_at for i in committed]
    if stamps != sorted(stamps):
        problems.append("commits out of txid order")
    if [i.metadata for i in committed[:TXIDS]] != [
        {p: [BATCH * (t - 1), BATCH * t] for p in "01"}
        for t in range(1, len(committed[:TXIDS]) + 1)
    ]:
        problems.append("committed batches do not tile the data")
    if any(i.status.value != "committed" for i in infos[:TXIDS]):
        problems.append("a txid is left in flight")
    replays = reemissions(i for i in infos if i.txid <= TXIDS)
    if plan.fault == NO_FAULT and replays:
        problems.append(f"{replays} attempt(s) re-emitted in a run without a fault")
    herd_restarts = {k: v - restarts_before[k] for k, v in deployment.stack.restarts.items()}
    if plan.fault in (
        "cascade_herd",
        "kill_processing",
        "restart_log_postgres",
        "kill_log_backend",
        NO_FAULT,
    ) and any(herd_restarts.values()):
        problems.append(f"an Airflow component died and was restarted: {herd_restarts}")

    truth = word_counts(
        line for lines in plan.data.values() for line in lines[: BATCH * len(committed)]
    )
    state = MapState(plan.name, state_name(plan), keys={"word": "text"})
    with txlog.engine.connect() as conn:
        got = Counter({k[0]: v for k, v in state.items(conn).items()})
    lost = sum((truth - got).values())
    doubled = sum((got - truth).values())
    lake: dict[str, object] = {}
    sink = lake_sink(deployment.workdir, plan)
    if sink is not None:  # the table against the log and the word counts of each txid's batch
        lake = check_lake_table(sink, deployment.log_url, plan.name, plan.data, committed, problems)
        lake["state_lost"], lake["state_doubled"] = lost, doubled
        lost += int(lake["lost"])  # type: ignore[call-overload]
        doubled += int(lake["doubled"])  # type: ignore[call-overload]
    seconds = None
    if recovered and not problems:
        last = max((i.committed_at for i in committed if i.txid in in_flight), default=None)
        seconds = max(0.0, (last - fault_at).total_seconds()) if last else 0.0
    attempts = {t: txlog.attempts(plan.name, t) for t in range(1, TXIDS + 1)}
    # Attempts failed on their own because their staged rows were gone (crash recovery emptied
    # staging), not those failed with an earlier txid.
    lost_staging = sum(
        a.failed_by == t and "staged rows" in (a.error or "")
        for t, of_txid in attempts.items()
        for a in of_txid
    )
    txlog.engine.dispose()
    return FaultResult(
        fault=plan.label or plan.fault,
        seed=plan.seed,
        recovered=recovered and not problems,
        seconds_to_recover=seconds,
        records_lost=lost,
        records_doubled=doubled,
        detail="; ".join(
            [
                detail,
                *problems,
                f"{replays} replays"
                + (f" ({lost_staging} attempts failed: staged rows lost)" if lost_staging else ""),
                *([f"lake {lake}"] if lake else []),
            ]
        ),
        extra={"lake": lake} if lake else {},
        reemitted=replays,
    )


def _snapshot(d: Deployment, plan: Plan, txlog: Any) -> str:
    """What a run that did not heal was left in: each txid in the log, each run's tasks."""
    lines = [f"--- {plan.name} (seed {plan.seed}) at the timeout ---"]
    for info in txlog.transactions(plan.name):
        lines.append(
            f"txid {info.txid} attempt {info.attempt} {info.status.value} "
            f"lease {info.lease_expires_at} failed_by {info.failed_by}: {info.last_error or ''}"
        )
    try:
        api = d.api()
        for run in api.runs(plan.name):
            tis = api.task_instances(plan.name, run["dag_run_id"])
            states = ", ".join(
                f"{ti['task_id']}={ti['state']}(try {ti['try_number']})" for ti in tis
            )
            lines.append(f"{run['dag_run_id']} {run['state']}: {states}")
    except Exception as err:  # the api-server may be what broke
        lines.append(f"(task instances unavailable: {err})")
    return "\n".join(lines)


def _first_failure(txlog: Any, pipeline: str) -> datetime | None:
    ends = [
        a.ended_at
        for t in range(1, TXIDS + 1)
        for a in txlog.attempts(pipeline, t)
        if a.status.value == "failed" and a.failed_by == t
    ]
    return min(ends) if ends else None


def run_plans(deployment: Deployment, plans: Sequence[Plan]) -> list[FaultResult]:
    """Run each plan on ``deployment`` in order (:func:`run_one`), a line each; a run that did not
    recover also prints the tail of the deployment's logs."""
    from chaos.fast import lake_summary

    results = []
    for plan in plans:
        started = time.monotonic()
        result = run_one(deployment, plan)
        results.append(result)
        took = result.seconds_to_recover
        print(
            f"  {plan.label:<26} seed {plan.seed:<10} {'ok ' if result.ok else 'FAIL'} "
            f"recovered in {'-' if took is None else f'{took:.1f}'} s, "
            f"re-emitted {result.reemitted}{lake_summary(result)} "
            f"(run {time.monotonic() - started:.0f} s): {result.detail}",
            flush=True,
        )
        if not result.ok:
            print(deployment.stack.tail(lines=60), flush=True)
    return results


def run_suite(
    faults: Sequence[str],
    seed: int,
    *,
    repeat: int = 1,
    workdir: Path | None = None,
    sink: str = "none",
    only: Collection[str] | None = None,
) -> list[FaultResult]:
    """Plan, start one deployment, run every plan in order, stop; print one line per run.

    :param sink: ``none``, ``delta`` or ``iceberg``: the lake table every run's pipeline also
        writes, and the checks verify (a fault given as ``fault@delta`` has its own; see
        :func:`plan_runs`). The plans (data, faults, moments) do not depend on it.
    :param only: run only these entries of ``faults``; each keeps the seed it draws in the
        whole list (a subset of a suite replays exactly those of its runs).
    """
    plans = [p for p in plan_runs(faults, seed, repeat, sink) if only is None or p.label in only]
    shown = faults if only is None else [f for f in faults if f in only]
    print(
        f"chaos on Airflow: seed {seed}, faults {','.join(shown)}, repeat {repeat}"
        + ("" if sink == "none" else f", sink {sink}"),
        flush=True,
    )
    owned = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="txn-chaos-airflow-"))
    os.chmod(workdir, 0o755)  # the Postgres servers run as user postgres
    deployment = start(plans, workdir)
    try:
        results = run_plans(deployment, plans)
    finally:
        stop(deployment)
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random)")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated; fault@delta or fault@iceberg: that run with its own lake sink",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each fault")
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="none",
        help="also write the word count into a lake table, and check it (default: none)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    results = run_suite(args.faults.split(","), seed, repeat=args.repeat, sink=args.sink)
    title = None
    if args.sink != "none":
        title = f"chaos on Airflow, sink {args.sink} (seed {seed}): the state's and the table's"
    print_table(results, title=title)
    print(
        f"replay with: python chaos/on_airflow.py --seed {seed} --faults {args.faults} "
        f"--repeat {args.repeat}" + ("" if args.sink == "none" else f" --sink {args.sink}")
    )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
