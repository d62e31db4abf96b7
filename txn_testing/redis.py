"""A throwaway Redis server on 127.0.0.1: the Celery broker of the distributed tests and demo.

Debian's ``redis-server`` (``make system-deps`` installs it when missing), started in the
foreground by the test itself (never as a system service), in memory only, bound to loopback.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from txn_testing.postgres import free_port


@dataclass
class RedisServer:
    """:param port: TCP port on 127.0.0.1; a free one if ``None``.
    :param workdir: its log; a temporary folder if ``None``."""

    port: int | None = None
    workdir: Path | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The Celery broker URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `apt-get install -y redis-server` "
                "(make system-deps does)"
            )
        self.port = self.port or free_port()
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="txn-redis-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "redis.log", "ab")
        # A broker for tests: in memory only (a restart loses queued messages, as Celery expects
        # a broker may), and nothing listens beyond loopback.
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self._proc.returncode}:\n{self.tail()}")
            if self.ping():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"redis-server not answering after {timeout:.0f} s:\n{self.tail()}")

    def ping(self) -> bool:
        """``PING`` → ``+PONG``, in Redis's own protocol (no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port or 0), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def tail(self, lines: int = 20) -> str:
        path = (self.workdir or Path("/nonexistent")) / "redis.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
