"""`make demo` smoke test: from a clean folder the demo comes up on a real Airflow, Spark Connect
and Postgres, txids commit, `make demo-stop` leaves none of its processes running, and a second
`make demo` continues from the last committed txid.

Runs ``scripts/demo.py`` (what ``make demo`` runs after installing) with free ports.
"""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from txn_testing.postgres import free_port

pytestmark = pytest.mark.scenario  # make test-scenarios: `make demo` up, stopped, continued; ~4 min

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "scripts" / "demo.py"
COMMITTED = re.compile(r"example_txn_words txid (\d+) committed")
KAFKA_COMMITTED = re.compile(r"example_txn_kafka_words txid (\d+) committed")


def processes_of(home: Path) -> list[str]:
    """Every live process whose command line or environment mentions the demo folder."""
    found = []
    marker = str(home).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(") ", 1)[-1][:1]
        except OSError:
            continue
        if state != "Z" and (marker in cmdline or marker in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {command}")
    return found


class Demo:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(DEMO),
                "up",
                "--home",
                str(home),
                "--port",
                str(free_port()),
                "--pg-port",
                str(free_port()),
                "--unpause",
                "example_txn_words",
                "--unpause",
                "example_txn_kafka_words",  # on the demo's Kafka cluster, fed by the demo
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_commits(
        self, count: int, above: int = 0, timeout: float = 400, pattern: re.Pattern[str] = COMMITTED
    ) -> list[int]:
        """The next ``count`` txids above ``above`` that the demo prints as committed (of
        ``example_txn_words``, or of the pipeline ``pattern`` names)."""
        # lines read while waiting for another pipeline's commits count too
        committed = [
            int(m.group(1))
            for line in self.output
            if (m := pattern.search(line)) and int(m.group(1)) > above
        ]
        deadline = time.monotonic() + timeout
        while len(committed) < count:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{len(committed)} of {count} commits after {timeout:.0f} s:\n"
                    + "".join(self.output[-60:])
                ) from None
            self.output.append(line)
            match = pattern.search(line)
            if match and int(match.group(1)) > above:
                committed.append(int(match.group(1)))
            assert self.proc.poll() is None or not self.lines.empty(), "".join(self.output[-60:])
        return committed

    def drain(self) -> None:
        """Keep every line printed so far (after the process exited: all of them)."""
        while not self.lines.empty():
            self.output.append(self.lines.get())

    def stop(self) -> None:
        stop = subprocess.run(
            [sys.executable, str(DEMO), "stop", "--home", str(self.home)],
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert self.proc.wait(60) == 0, "".join(self.output[-60:])


def test_demo_comes_up_commits_stops_clean_and_continues():
    home = Path(tempfile.mkdtemp(prefix="txn-demo-airflow-"))
    home.chmod(0o755)  # the Postgres server runs as user postgres, which must enter this folder
    try:
        first = Demo(home)
        try:
            committed = first.wait_for_commits(5)
            kafka_committed = first.wait_for_commits(2, pattern=KAFKA_COMMITTED)
        finally:
            first.stop()
        assert committed == list(range(1, 6))  # txids commit in order, from 1
        assert kafka_committed[:1] == [1]
        out = "".join(first.output)
        assert "login admin / admin" in out and "/transactions/" in out
        time.sleep(1)
        assert processes_of(home) == []
        assert not (home / "demo.json").exists()

        first.drain()
        printed = max(int(m.group(1)) for line in first.output if (m := COMMITTED.search(line)))
        kafka_printed = max(
            int(m.group(1)) for line in first.output if (m := KAFKA_COMMITTED.search(line))
        )

        second = Demo(home)  # the same folder: continues after the last committed txid
        try:
            # A commit just before the stop may not have been printed: well past those.
            second.wait_for_commits(1, above=printed + 4)
            # the Kafka broker kept nothing (its log is in memory): the demo declares the reset
            # an operator would, from the txid after the last committed one, and it goes on
            second.wait_for_commits(1, above=kafka_printed + 1, pattern=KAFKA_COMMITTED)
            said = "".join(second.output)
            assert "the Kafka broker restarted empty" in said
            assert "reset_log_from_txid=" in said
        finally:
            second.stop()
        second.drain()

        # The log survived: the second run lists the first run's commits unchanged (txids and
        # batches; a fresh log would start again at txid 1 with other offsets).
        def commit_lines(output, pattern=COMMITTED, upto=printed):
            found = {}
            for line in output:
                match = pattern.search(line)
                if match and int(match.group(1)) <= upto:
                    found[int(match.group(1))] = line[line.index("{") :]
            return found

        assert commit_lines(second.output) == commit_lines(first.output)
        assert len(commit_lines(first.output)) == printed
        kafka_lines = {"pattern": KAFKA_COMMITTED, "upto": kafka_printed}
        assert commit_lines(second.output, **kafka_lines) == commit_lines(
            first.output, **kafka_lines
        )
        time.sleep(1)
        assert processes_of(home) == []
    finally:
        leftovers = processes_of(home)
        if not leftovers:
            shutil.rmtree(home, ignore_errors=True)
