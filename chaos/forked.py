"""Worker processes forked from a warmed fork server, as Airflow forks a task process from its
supervisor: the fast chaos tier's workers (:mod:`chaos.worker`) start with pyspark's Spark Connect
client and Airflow's metrics already imported.

A worker started with ``python -m chaos.worker`` spends ~9 s of CPU importing them itself (three
at once on two cores took 15 s to reach Spark, most of a run's time); forked, it reaches Spark in
well under a second. Each worker is still a process of its own: its own session and process group
(a fault's ``killpg`` takes all of it), its own environment, output into its own log file, and an
exit code (``-9`` when SIGKILLed) read as :class:`subprocess.Popen`'s is (``poll``).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path

PRELOAD = (
    "chaos.worker",
    "pyspark.sql.connect.session",
    # what the provider's metrics import at a worker's first timing (absent ones are skipped)
    "airflow.sdk.observability.stats",
    "airflow.sdk.observability.metrics.stats_utils",
)
"""Modules the fork server imports once, before it forks any worker."""

_context: ForkServerContext | None = None


def _fork_server() -> ForkServerContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        _context = context
    return _context


def _run(main: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, out: str) -> None:
    """In the forked child: a session of its own, its environment, output to ``out``; then the
    module's ``main(argv)``, whose return value is the exit code."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    module = __import__(main, fromlist=["main"])
    sys.exit(module.main(list(argv)))


class ForkedProcess:
    """A worker forked from the fork server: the part of :class:`subprocess.Popen` the fast tier
    uses (``pid``, ``poll``, ``wait``, ``send_signal``)."""

    def __init__(
        self, main: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, out: Path
    ) -> None:
        self._process = _fork_server().Process(
            target=_run, args=(main, list(argv), dict(env), str(cwd), str(out)), daemon=False
        )
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode
