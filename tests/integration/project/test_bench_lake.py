"""`make bench-lake`'s script runs: a `--quick` smoke run on the session's Spark Connect server
(its own Postgres), every side checked exact by the script itself, the ratio lines printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.scenario  # make test-scenarios: the benchmark's smoke run; CI tests the lake sinks
def test_bench_lake_quick_runs_and_prints_its_ratios(connect_server):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_lake.py"),
            "--quick",
            "--connect-url",
            connect_server.url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"exact: \d+ rows in each of plain Parquet, Delta, Iceberg", out), out
    ratio = re.search(r"ratio ours / plain, .*: Delta (\d+\.\d+)x, Iceberg (\d+\.\d+)x", out)
    assert ratio is not None, out
    assert all(float(r) > 0 for r in ratio.groups())
