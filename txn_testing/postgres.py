"""A throwaway Postgres server in a local folder, for tests, benchmarks and the demo.

Uses the Debian PostgreSQL binaries (``/usr/lib/postgresql/<version>/bin``). ``initdb`` and the
server refuse to run as root, so as root they run as the ``postgres`` system user (created by the
Debian package) through ``runuser``. The server listens on 127.0.0.1 only, with trust auth.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def postgres_bindir() -> Path:
    """The newest installed PostgreSQL server's bin directory."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not candidates:
        raise RuntimeError(
            "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin; "
            "install them with `apt-get install -y postgresql` (make system-deps does)"
        )
    return Path(candidates[-1]).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedPostgres:
    """One Postgres cluster in ``datadir`` (created on first start, reused afterwards).

    :param datadir: cluster folder; a temporary one if ``None`` (removed by :meth:`stop`).
    :param port: TCP port on 127.0.0.1; a free one if ``None``.
    :param durable: ``False`` turns fsync off (tests: faster, and the data is thrown away anyway).
    """

    datadir: Path | None = None
    port: int | None = None
    durable: bool = True
    settings: dict[str, str] = field(default_factory=dict)
    _owns_datadir: bool = field(default=False, init=False)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["runuser", "-u", "postgres", "--", *argv]

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self) -> EmbeddedPostgres:
        bindir = postgres_bindir()
        if self.datadir is None:
            # Not pytest's tmp_path: its parents are private to root; the server runs as postgres.
            self.datadir = Path(tempfile.mkdtemp(prefix="txn-pg-"))
            self._owns_datadir = True
        self.datadir = Path(self.datadir).resolve()
        self.datadir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            for parent in self.datadir.parents:
                if not os.stat(parent).st_mode & 0o001:
                    raise RuntimeError(
                        f"the server runs as user postgres, which cannot enter {parent} "
                        f"(mode {oct(os.stat(parent).st_mode & 0o777)}); put the data folder "
                        "elsewhere or make its parents traversable (chmod o+x)"
                    )
        os.chmod(self.datadir, 0o700)
        self._chown(self.datadir)
        if not (self.datadir / "PG_VERSION").exists():
            subprocess.run(
                self._as_server_user(
                    [
                        str(bindir / "initdb"),
                        "-D",
                        str(self.datadir),
                        "-U",
                        "postgres",
                        "-A",
                        "trust",
                        "-E",
                        "UTF8",
                        "--locale=C",
                    ]
                ),
                check=True,
                capture_output=True,
            )
        if self.port is None:
            self.port = free_port()
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.datadir),
            "max_connections": "200",
            "shared_buffers": "256MB",
            **(
                {}
                if self.durable
                else {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
            ),
            **self.settings,
        }
        opts = " ".join(f"-c {k}={v}" for k, v in options.items())
        logfile = self.datadir / "server.log"
        proc = subprocess.run(
            self._as_server_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-o",
                    opts,
                    "-l",
                    str(logfile),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = logfile.read_text()[-2000:] if logfile.exists() else ""
            raise RuntimeError(f"postgres failed to start: {proc.stderr}\n{tail}")
        self._wait_ready()
        log.info("postgres started on 127.0.0.1:%s (%s)", self.port, self.datadir)
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", int(self.port or 0)), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its folder if it made it."""
        self.halt(mode="fast")
        if self._owns_datadir and self.datadir is not None:
            shutil.rmtree(self.datadir, ignore_errors=True)

    def halt(self, *, mode: str = "immediate") -> None:
        """Stop the server, keeping its data: ``immediate`` is a crash (recovery at the next
        start), as a machine losing power or a killed postmaster; ``fast`` a clean shutdown."""
        if self.datadir is None or not (self.datadir / "postmaster.pid").exists():
            return
        subprocess.run(
            self._as_server_user(
                [
                    str(postgres_bindir() / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    mode,
                    "-w",
                    "stop",
                ]
            ),
            capture_output=True,
        )

    def client_backends(self) -> list[int]:
        """Pids of the server's client backends (connections), from the postmaster's children."""
        postmaster = int((Path(self.datadir or "") / "postmaster.pid").read_text().split()[0])
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:  # gone meanwhile
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            # A backend's title is "postgres: <user> <database> <host>(<port>) <state>".
            if ppid == postmaster and "127.0.0.1(" in title:
                found.append(int(entry.name))
        return sorted(found)

    def kill_backend(self, pid: int | None = None, *, timeout: float = 60.0) -> int:
        """SIGKILL one client backend (``pid``, or any), as the OOM killer does, and wait until
        the server accepts connections again. The server stays up, but the postmaster resets
        every backend and runs crash recovery: every UNLOGGED table comes back empty, and
        ``pg_postmaster_start_time()`` does not change. Returns the pid killed."""
        import psycopg2

        if pid is None:
            backends = self.client_backends()
            if not backends:  # open one to kill
                conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres")
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid()")
                    pid = int(cur.fetchone()[0])
            else:
                pid = backends[0]
        logfile = Path(self.datadir or "") / "server.log"
        seen = logfile.stat().st_size
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        # Ready once the server log says so after the kill: before the postmaster noticed, a
        # connection could still succeed on the old, unrecovered server.
        while b"ready to accept connections" not in logfile.read_bytes()[seen:]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"postgres did not recover within {timeout}s of the kill")
            time.sleep(0.1)
        self._wait_ready()
        return pid

    def restart(self, down_for: float, *, mode: str = "immediate") -> None:
        """Crash (or stop) the server, keep it down ``down_for`` seconds, start it again on the
        same port: what a database restart or failover looks like to its clients."""
        self.halt(mode=mode)
        time.sleep(down_for)
        self.start()

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
