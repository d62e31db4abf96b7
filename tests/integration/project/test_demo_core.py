"""`make demo-core`'s script runs, keeps exactly-once totals, and a second run continues."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from txn_testing.postgres import free_port

ROOT = Path(__file__).resolve().parents[3]


def run_demo(datadir: Path, txids: int) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "demo_core.py"),
            "--datadir",
            str(datadir),
            "--port",
            str(free_port()),
            "--txids",
            str(txids),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_demo_runs_and_continues():
    base = Path(tempfile.mkdtemp(prefix="txn-demo-"))
    base.chmod(0o755)  # the server runs as user postgres, which must enter this folder
    datadir = base / "pg"
    try:
        first = run_demo(datadir, 5)
        assert "committed txids: 5; total words: 200" in first
        assert "failed with txid 2: injected failure" in first  # the cascade is visible
        second = run_demo(datadir, 3)
        assert "committed txids: 8; total words: 320" in second
        assert not (datadir / "postmaster.pid").exists()  # the demo stopped its server
    finally:
        shutil.rmtree(base, ignore_errors=True)  # 40 MB a run: left behind, runs fill the disk
