"""Many pipelines on one Airflow: what idle pipelines cost against Airflow's own floor, and the
latency of a trickle and of a burst, with every state checked against ground truth.

Run with ``make bench-pipelines`` (N = 20, then N = 100 with ``max_pending`` 2). Starts its own
Postgres clusters (Airflow's metadata; the transaction log), a Spark Connect server (local[2]) and
Airflow (scheduler with the LocalExecutor, dag-processor, triggerer, api-server), all on
127.0.0.1, with N word-count pipelines (``benchmarks/pipelines_dags/many_words.py``: a Parquet
directory each, one transactional map state, created paused), a DAG file each (``--one-file``:
all N in one file, whose every parse, a task's start included, then builds all N DAGs). Phases,
in one deployment:

1. **paused**: the N DAGs parsed, all paused: Airflow's own floor for them;
2. **single**: one pipeline unpaused, fed one small file every ``--trickle-every`` seconds: the
   arrival-to-commit latency of a pipeline alone on the machine;
3. **idle**: all N unpaused, their first data committed, nothing arriving;
4. **burst**: right after the idle phase (as users meet it: pipelines that were idle for a
   while), a file in every pipeline at once: seconds until all are committed, and where those
   seconds went (run created, claimed, processed, committed: medians over the N txids);
5. **trickle**: one small file per pipeline every ``--trickle-every`` seconds (staggered):
   CPU, and each file's arrival-to-commit latency (the txid that first covers the file, by the
   log's ``committed_at``).

Airflow runs with its own defaults where a deployment would (``--parallelism`` 32, Airflow's
default, unless given), and with the provider's preload as installed (``--no-preload``: with
``[txn_provider] preload_task_processes`` off, as deployments ran before it was automatic).
``--quick`` runs phases 1, 3 and 4 only.

CPU is sampled by process group (``txn_testing/cpu.py``) over ``--sample`` seconds of each of
phases 1, 3 and 4 and printed as CPU-s per second, side by side, with the goals of issue 41:
idle <= 1.3 x paused; trickle median latency <= 2 x the single pipeline's, no pipeline's worst
over 5 x the median; burst of 20 committed within 25 s.

Usage: python benchmarks/bench_pipelines.py [--pipelines 20] [--max-pending 4] [--sample 60]
       [--trickle-every 5] [--lines 100] [--seed 41] [--one-file]
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
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from airflow_txn_provider.state import MapState  # noqa: E402
from airflow_txn_provider.transactions.transaction_log import TransactionLog  # noqa: E402
from tests.spark_data import random_lines, word_counts  # noqa: E402
from txn_testing import cpu  # noqa: E402
from txn_testing.airflow import AirflowStack, txn_log_connection_env  # noqa: E402
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}
META_PG, LOG_PG = "metadata Postgres", "log Postgres"
GROUPS = (
    cpu.SCHEDULER,
    cpu.DAG_PROCESSOR,
    cpu.TRIGGERER,
    cpu.API_SERVER,
    cpu.TASKS,
    META_PG,
    LOG_PG,
    cpu.SPARK,
)
AIRFLOW_PARALLELISM = 32
"""Airflow's default ``[core] parallelism``: the tasks a deployment runs at once."""
SETTLE = 20.0
"""Seconds a phase runs before its CPU is sampled (runs finishing, parsing settling)."""


class Feed:
    """The pipelines' data: one Parquet partition each, files written whole (a temporary name,
    then a rename), every line kept for the ground truth."""

    def __init__(self, root: Path, names: list[str], lines: int, seed: int) -> None:
        self.root, self.lines, self.rng = root, lines, random.Random(seed)
        self.written: dict[str, list[str]] = {n: [] for n in names}
        self.files: list[tuple[str, int, float]] = []
        """Each file: its pipeline, its end offset (exclusive), when it was in place."""
        self._lock = threading.Lock()

    def data(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str) -> None:
        lines = random_lines(self.rng.randrange(10**9), self.lines)
        with self._lock:
            start = len(self.written[name])
            self.written[name] += lines
        directory = self.data(name) / "p=0"
        directory.mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {
                "offset": pa.array(range(start, start + len(lines)), pa.int64()),
                "line": pa.array(lines, pa.string()),
            }
        )
        tmp = self.root / f".{name}-{start}.tmp"
        pq.write_table(table, tmp)
        os.rename(tmp, directory / f"part-{start:010d}.parquet")
        with self._lock:
            self.files.append((name, start + len(lines), time.time()))


def dag_files(folder: Path, names: list[str], feed: Feed) -> Path:
    """A DAG file per pipeline, as copies of one pipeline are deployed."""
    folder.mkdir(parents=True)
    lib = ROOT / "benchmarks" / "pipelines_dags"
    for name in names:
        (folder / f"{name}.py").write_text(
            f'"""{name}: an Airflow DAG of bench-pipelines."""\n\n'
            "import sys\n"
            f"sys.path.insert(0, {str(lib)!r})\n"
            "from many_words import word_count_dag\n\n"
            f"dag = word_count_dag({name!r}, {str(feed.data(name))!r})\n"
        )
    return folder


def committed_txids(engine: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM txn_transaction WHERE status = 'committed'")
            ).scalar_one()
        )


def committed(engine: Any) -> dict[str, list[tuple[int, float]]]:
    """Each pipeline's committed txids as ``(end offset, committed_at epoch seconds)``."""
    found: dict[str, list[tuple[int, float]]] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT pipeline, metadata, committed_at FROM txn_transaction "
                "WHERE status = 'committed' ORDER BY pipeline, txid"
            )
        )
        for pipeline, metadata, at in rows:
            end = max(int(r[1]) for r in dict(metadata).values())
            found.setdefault(pipeline, []).append((end, at.timestamp()))
    return found


def latencies(engine: Any, files: list[tuple[str, int, float]]) -> dict[str, list[float]]:
    """Each file's arrival-to-commit seconds: until the first txid that covers it committed."""
    done = committed(engine)
    out: dict[str, list[float]] = {}
    for name, end, at in files:
        covering = [when for txid_end, when in done.get(name, []) if txid_end >= end]
        if not covering:
            raise AssertionError(f"{name}: the file ending at offset {end} never committed")
        out.setdefault(name, []).append(max(0.0, min(covering) - at))
    return out


def wait_committed(engine: Any, feed: Feed, names: list[str], timeout: float) -> float:
    """Seconds until every pipeline of ``names`` committed all its lines."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        done = committed(engine)
        if all(
            max((e for e, _ in done.get(n, [])), default=0) >= len(feed.written[n]) for n in names
        ):
            return time.monotonic() - started
        time.sleep(0.25)
    raise AssertionError(f"not all committed within {timeout:.0f} s")


def last_txids(engine: Any) -> dict[str, int]:
    """Each pipeline's newest txid in the log."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT pipeline, max(txid) FROM txn_transaction GROUP BY 1"))
        return {pipeline: int(txid) for pipeline, txid in rows}


def burst_steps(engine: Any, before: dict[str, int], started: float) -> dict[str, float]:
    """Medians, over the burst's first txid of each pipeline, of the seconds from the burst's
    files to each step the log records: begun (its run created, scheduled, claimed), processed,
    committed."""
    steps: dict[str, list[float]] = {"begun": [], "processed": [], "committed": []}
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT pipeline, txid, begun_at, processed_at, committed_at FROM txn_transaction")
        )
        for pipeline, txid, begun, processed, done in rows:
            if txid != before.get(pipeline, 0) + 1:
                continue
            for step, at in (("begun", begun), ("processed", processed), ("committed", done)):
                if at is not None:
                    steps[step].append(at.timestamp() - started)
    return {step: statistics.median(v) for step, v in steps.items() if v}


def sample(seconds: float, postmasters: dict[int, str]) -> dict[str, float]:
    """CPU-s per second by group over ``seconds``."""
    before = cpu.cpu_by_group(postmasters)
    time.sleep(seconds)
    used = cpu.cpu_since(before, postmasters)
    return {g: v / seconds for g, v in used.items()}


def trickle(feed: Feed, names: list[str], every: float, duration: float) -> None:
    """One file per pipeline every ``every`` seconds for ``duration`` seconds, staggered evenly."""
    started = time.monotonic()
    step = every / len(names)
    n = 0
    while time.monotonic() - started < duration:
        due = started + n * step
        time.sleep(max(0.0, due - time.monotonic()))
        feed.write(names[n % len(names)])
        n += 1


def check_truth(txlog: TransactionLog, feed: Feed, names: list[str]) -> None:
    with txlog.engine.connect() as conn:
        for name in names:
            state = MapState(name, f"{name}_counts", keys={"word": "text"})
            got = {k[0]: v for k, v in state.items(conn).items()}
            assert got == dict(word_counts(feed.written[name])), f"{name}: state is wrong"


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    names = [f"many_{i:03d}" for i in range(args.pipelines)]
    feed = Feed(workdir / "data", names, args.lines, args.seed)
    (workdir / "data").mkdir(parents=True)
    result: dict[str, Any] = {}
    with (
        EmbeddedPostgres(durable=False) as meta_pg,
        EmbeddedPostgres(durable=False) as log_pg,
        SparkConnectServer(workdir=workdir / "connect", conf=SPARK_CONF) as connect,
    ):
        postmasters = {
            cpu.postmaster_pid(meta_pg.datadir): META_PG,
            cpu.postmaster_pid(log_pg.datadir): LOG_PG,
        }
        admin = create_engine(meta_pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE meta"))
        admin.dispose()
        txlog = TransactionLog.from_url(log_pg.url)
        env = {
            # Airflow's default, named: the floor users have
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
            # Airflow's default too, as docs/airflow.md advises for many pipelines on few
            # cores: judged by 15 s, a loaded scheduler resets its own running tasks
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "30",
            "BENCH_PIPELINES_MAX_PENDING": str(args.max_pending),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect.url,
            **txn_log_connection_env("txn_log_default", log_pg.url.replace("+psycopg", "")),
        }
        if args.one_file:
            specs = [{"name": n, "data": str(feed.data(n))} for n in names]
            env["BENCH_PIPELINES"] = json.dumps(specs)
            dags = ROOT / "benchmarks" / "pipelines_dags"
        else:
            dags = dag_files(workdir / "dags", names, feed)
        meta = meta_pg.url.rsplit("/", 1)[0] + "/meta"
        stack = AirflowStack(
            workdir / "airflow",
            meta,
            dags,
            env=env,
            failure_injection=False,
            parallelism=args.parallelism,
            preload=not args.no_preload,
        )
        with stack:
            api = stack.client()
            for name in names:
                api.wait_for_dag(name, timeout=600)
            for name in names:
                feed.write(name)  # each pipeline's first data, there before it is unpaused
            print(f"  {len(names)} DAGs parsed; phase 1: paused", flush=True)
            time.sleep(SETTLE)
            result["paused"] = sample(args.sample, postmasters)

            if not args.quick:
                print("  phase 2: one pipeline alone, a file every few seconds", flush=True)
                api.unpause(names[0])
                wait_committed(txlog.engine, feed, names[:1], 300)
                single_from = len(feed.files)
                trickle(feed, names[:1], args.trickle_every, args.trickle_every * args.single_files)
                wait_committed(txlog.engine, feed, names[:1], 300)
                result["single"] = latencies(txlog.engine, feed.files[single_from:])

            print("  phase 3: all unpaused, idle", flush=True)
            for name in names[0 if args.quick else 1 :]:
                api.unpause(name)
            wait_committed(txlog.engine, feed, names, 900)
            time.sleep(SETTLE)
            result["idle"] = sample(args.sample, postmasters)

            print("  phase 4: a burst into every pipeline, after the idle phase", flush=True)
            burst_txids = last_txids(txlog.engine)
            started = time.time()
            for name in names:
                feed.write(name)
            result["burst"] = wait_committed(txlog.engine, feed, names, 900)
            result["burst_steps"] = burst_steps(txlog.engine, burst_txids, started)

            if not args.quick:
                print("  phase 5: a trickle into every pipeline", flush=True)
                trickle_from = len(feed.files)
                txids_before, started = committed_txids(txlog.engine), time.monotonic()
                writer = threading.Thread(
                    target=trickle,
                    args=(feed, names, args.trickle_every, SETTLE + args.sample),
                    daemon=True,
                )
                writer.start()
                time.sleep(SETTLE)
                result["trickle"] = sample(args.sample, postmasters)
                writer.join()
                wait_committed(txlog.engine, feed, names, 900)
                result["trickle_txids"] = committed_txids(txlog.engine) - txids_before
                result["trickle_seconds"] = time.monotonic() - started
                result["trickle_latency"] = latencies(txlog.engine, feed.files[trickle_from:])
            check_truth(txlog, feed, names)
            with txlog.engine.connect() as conn:
                result["reemissions"] = conn.execute(
                    text("SELECT count(*) FROM txn_attempt WHERE attempt > 1")
                ).scalar()
                # why attempts were re-emitted: each failed attempt's error, first line, counted
                result["failures"] = conn.execute(
                    text(
                        "SELECT split_part(coalesce(error, '(none)'), E'\\n', 1) AS why, "
                        "count(*) FROM txn_attempt WHERE status = 'failed' "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 8"
                    )
                ).all()
        txlog.engine.dispose()
    return result


def report(args: argparse.Namespace, result: dict[str, Any]) -> bool:
    paused, idle, busy = result["paused"], result["idle"], result.get("trickle", {})
    print(
        f"\nbench-pipelines: N = {args.pipelines}, max_pending {args.max_pending}, "
        f"{'one DAG file' if args.one_file else 'a DAG file per pipeline'}, "
        f"{os.cpu_count()} cores, CPU-s per second over {args.sample:.0f} s each "
        f"(trickle: a {args.lines}-line file per pipeline every {args.trickle_every:g} s)\n"
    )
    print("| process group | paused (Airflow's floor) | idle | trickle |")
    print("|---|---|---|---|")
    for group in (*GROUPS, cpu.DRIVER):
        cells = [f"{phase.get(group, 0.0):.2f}" for phase in (paused, idle, busy)]
        print(f"| {group} | " + " | ".join(cells) + " |")

    def total(phase: dict[str, float]) -> float:
        return sum(phase.get(g, 0.0) for g in GROUPS)

    print("| **all** | " + " | ".join(f"**{total(p):.2f}**" for p in (paused, idle, busy)) + " |")
    idle_ratio = total(idle) / total(paused)
    goals = {f"idle <= 1.3 x paused ({idle_ratio:.2f} x)": idle_ratio <= 1.3}
    if args.pipelines == 20:
        goals[f"burst of 20 committed within 25 s ({result['burst']:.1f} s)"] = (
            result["burst"] <= 25
        )
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in result["burst_steps"].items())
    print(
        f"\nburst (a file in all {args.pipelines} at once, after the idle phase): all committed "
        f"in {result['burst']:.1f} s; medians from the files: {steps}"
    )
    if not args.quick:
        single = [s for v in result["single"].values() for s in v]
        per_pipeline = result["trickle_latency"]
        every = [s for v in per_pipeline.values() for s in v]
        median_single, median_all = statistics.median(single), statistics.median(every)
        worst = max(per_pipeline.items(), key=lambda kv: max(kv[1]))
        goals.update(
            {
                f"trickle median latency <= 2 x one pipeline's ({median_all:.1f} s vs "
                f"{median_single:.1f} s: {median_all / median_single:.2f} x)": median_all
                <= 2 * median_single,
                f"no pipeline's worst latency over 5 x the median (worst {max(worst[1]):.1f} s, "
                f"{worst[0]})": max(worst[1]) <= 5 * median_all,
                f"every pipeline committed its trickle ({len(per_pipeline)} of "
                f"{args.pipelines})": len(per_pipeline) == args.pipelines,
            }
        )
        print(
            f"latency, arrival to commit: one pipeline alone median {median_single:.2f} s; "
            f"N pipelines median {median_all:.2f} s, p95 "
            f"{statistics.quantiles(every, n=20)[-1]:.2f} s, max {max(every):.2f} s"
        )
        rate = result["trickle_txids"] / result["trickle_seconds"]
        added = {g: busy.get(g, 0.0) - idle.get(g, 0.0) for g in GROUPS}
        airflow = sum(v for g, v in added.items() if g.startswith("Airflow"))
        print(
            f"trickle: {result['trickle_txids']} txids committed in "
            f"{result['trickle_seconds']:.0f} s ({rate:.2f}/s) for {len(every)} files; above "
            f"idle, per txid: Airflow {airflow / rate:.2f} CPU-s, Spark "
            f"{added.get(cpu.SPARK, 0.0) / rate:.2f} CPU-s, all "
            f"{sum(added.values()) / rate:.2f} CPU-s"
        )
    print(f"re-emissions (attempts beyond the first): {result['reemissions']}")
    for why, count in result["failures"]:
        print(f"  {count} failed attempts: {why[:300]}")
    print("every state equals its ground truth (word counts of every line written)")
    print("\ngoals:")
    for goal, met in goals.items():
        print(f"  [{'met' if met else 'NOT met'}] {goal}")
    return all(goals.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=20)
    parser.add_argument("--max-pending", type=int, default=4)
    parser.add_argument("--sample", type=float, default=60.0)
    parser.add_argument("--trickle-every", type=float, default=5.0)
    parser.add_argument("--single-files", type=int, default=8)
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument(
        "--one-file", action="store_true", help="all N pipelines in one DAG file (dynamic DAGs)"
    )
    parser.add_argument(
        "--parallelism",
        type=int,
        default=AIRFLOW_PARALLELISM,
        help="Airflow's [core] parallelism (default: Airflow's own default, 32)",
    )
    parser.add_argument(
        "--no-preload", action="store_true", help="task processes not warmed by the preload"
    )
    parser.add_argument(
        "--quick", action="store_true", help="phases 1, 3 and 4 only (paused, idle, burst)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (data, logs) after the run"
    )
    args = parser.parse_args(argv)
    print(
        f"bench-pipelines: seed {args.seed}, N = {args.pipelines}, max_pending "
        f"{args.max_pending}, parallelism {args.parallelism}, preload "
        f"{'off' if args.no_preload else 'on'}, started {datetime.now():%H:%M:%S}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-pipelines-"))
    workdir.chmod(0o755)
    if not args.keep:  # its Postgres servers and data: hundreds of MB a run
        atexit.register(shutil.rmtree, workdir, True)
    result = run(args, workdir)
    return 0 if report(args, result) else 1


if __name__ == "__main__":
    sys.exit(main())
