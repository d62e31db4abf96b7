"""What a task process pays before its first Spark Connect call, fresh or forked from a warmed
parent (``airflow_txn_provider.preload``), side by side in one run.

Run with ``make bench-preload``. One Spark Connect server (local[2]) on 127.0.0.1; ``--runs``
times each:

* ``fresh process``: a new Python interpreter imports the Spark Connect client and the
  provider's job code, then opens a session and runs ``SELECT 1`` (what a task process did);
* ``forked from a warmed parent``: this process calls ``warm_task_processes`` once, then forks a
  child per run that opens a session and runs ``SELECT 1`` (what a task process forked by a
  scheduler or Celery worker does with the provider installed).

Prints the median seconds of each part and the ratio.

Usage: python benchmarks/bench_preload.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.spark import SparkConnectServer  # noqa: E402

FIRST_CALL = """
import time
from airflow_txn_provider.spark.connect_sessions import keep_classic_mode
from pyspark.sql import SparkSession

def first_call(url):
    started = time.perf_counter()
    with keep_classic_mode():
        session = SparkSession.builder.remote(url).create()
        session.sql("SELECT 1").collect()
    took = time.perf_counter() - started
    session.stop()
    return took
"""

FRESH = """
import sys, time
started = time.perf_counter()
import pyspark.sql.connect.session
import airflow_txn_provider.spark.job, airflow_txn_provider.operators.spark_runner
imports = time.perf_counter() - started
{first_call}
print(imports, first_call(sys.argv[1]))
"""


def fresh(url: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", FRESH.format(first_call=FIRST_CALL), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def forked(url: str) -> float:
    namespace: dict[str, object] = {}
    exec(FIRST_CALL, namespace)  # the same code as the fresh side runs
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what a task process forked by a warmed executor does
        os.close(read)
        took = namespace["first_call"](url)  # type: ignore[operator]
        os.write(write, str(took).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        value = float(pipe.read())
    os.waitpid(pid, 0)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-preload-"))
    with SparkConnectServer(workdir=workdir / "connect") as server:
        cold = [fresh(server.url) for _ in range(args.runs)]
        from airflow_txn_provider.preload import warm_task_processes

        warm_task_processes(force=True)
        warm = [forked(server.url) for _ in range(args.runs)]
    imports = statistics.median(i for i, _ in cold)
    session = statistics.median(s for _, s in cold)
    warmed = statistics.median(warm)
    print(f"\nbench-preload: {args.runs} runs each, medians, one Spark Connect server (local[2])")
    print("| task process | imports | first session + SELECT 1 | total |")
    print("|---|---|---|---|")
    print(f"| fresh | {imports:.2f} s | {session:.2f} s | {imports + session:.2f} s |")
    print(f"| forked from a warmed parent | 0 s | {warmed:.2f} s | {warmed:.2f} s |")
    print(f"warmed / fresh: {warmed / (imports + session):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
