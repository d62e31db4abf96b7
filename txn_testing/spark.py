"""Spark servers from the pip package, on loopback: a Spark Connect server and a standalone cluster.

For tests, benchmarks and the demo. Nothing is downloaded: everything runs from ``pyspark``'s own
``bin/`` and ``jars/``. Each server runs in a process group of its own, so stopping it stops every
process it started (JVMs, Python workers) and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from airflow_txn_provider.hooks.spark_submit import stop_process_group
from airflow_txn_provider.operators.spark_runner import spark_env
from airflow_txn_provider.spark.connect_sessions import bound_client_retries, keep_classic_mode
from txn_testing.postgres import free_port

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def loopback_env(**extra: str) -> dict[str, str]:
    """:func:`spark_env` bound to 127.0.0.1 (otherwise Spark binds the host's address)."""
    return spark_env(SPARK_LOCAL_IP=LOOPBACK, SPARK_LOCAL_HOSTNAME="localhost", **extra)


def _http_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


@dataclass
class _Process:
    """A child started in its own session; :meth:`stop` signals the whole group."""

    name: str
    argv: list[str]
    env: dict[str, str]
    logfile: Path
    popen: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None

    def start(self) -> None:
        self._out = open(self.logfile, "ab")
        self.popen = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.info("%s started (pid %s), log: %s", self.name, self.popen.pid, self.logfile)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is None:
            return
        stop_process_group(self.popen, timeout=timeout)
        if self._out is not None:
            self._out.close()
        log.info("%s stopped", self.name)


@dataclass
class SparkConnectServer:
    """A long-running Spark Connect server (``local[N]`` by default) on 127.0.0.1.

    One JVM for every txid: a client session costs ~0.3 s instead of a ~9 s ``spark-submit``.

    :param port: gRPC port; a free one if ``None``.
    :param master: the server's Spark master.
    :param workdir: logs and warehouse; a temporary folder if ``None``.
    :param conf: extra Spark settings.
    """

    port: int | None = None
    master: str = "local[2]"
    workdir: Path | None = None
    conf: dict[str, str] = field(default_factory=dict)
    ui_port: int | None = None
    _proc: _Process | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ui_port}"

    def start(self, timeout: float = 90.0) -> SparkConnectServer:
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="txn-spark-connect-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.ui.port": str(self.ui_port),
            "spark.sql.warehouse.dir": str(self.workdir / "warehouse"),
            "spark.sql.shuffle.partitions": "4",
            **self.conf,
        }
        argv = [
            str(spark_home() / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "Spark Connect server",
            "--master",
            self.master,
        ]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        self._proc = _Process(
            "Spark Connect server", argv, loopback_env(), self.workdir / "connect-server.log"
        )
        self._proc.start()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from pyspark.sql import SparkSession

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        assert self._proc is not None and self.port is not None
        port = self.port
        while time.monotonic() < deadline:
            if not self._proc.alive():
                raise RuntimeError(f"Spark Connect server exited:\n{self._proc.tail()}")
            try:
                # The port first: a gRPC channel that failed to connect backs off (up to
                # minutes) before it tries again, so a session is opened only once it listens.
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                with keep_classic_mode():
                    session = SparkSession.builder.remote(self.url).create()
                    bound_client_retries(session)
                    try:
                        session.range(1).collect()
                    finally:
                        session.stop()
                return
            except Exception as err:  # not up yet
                last = err
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Spark Connect server not ready after {timeout}s: {last}")

    def running_jobs(self) -> list[dict[str, Any]]:
        """Jobs the server's driver is running now (from its status REST API)."""
        apps = _http_json(f"{self.ui_url}/api/v1/applications")
        return list(
            _http_json(f"{self.ui_url}/api/v1/applications/{apps[0]['id']}/jobs?status=running")
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the server's whole process group (a crash: nothing is shut down cleanly).
        :meth:`start` brings a new server up on the same port."""
        if self._proc is not None and self._proc.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.popen.pid, signal.SIGKILL)
            self._proc.popen.wait(30)
            if self._proc._out is not None:
                self._proc._out.close()
            self._proc = None

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, from the pip package's jars.

    ``spark-class …Master`` / ``…Worker`` (the pip package has no ``start-master.sh``). Python
    applications run in client deploy mode against it (standalone cluster mode is JVM-only).
    """

    worker_cores: int = 2
    workers: int = 1
    worker_memory: str = "2g"
    workdir: Path | None = None
    port: int | None = None
    ui_port: int | None = None
    _procs: list[_Process] = field(default_factory=list, init=False)

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ui_port}"

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self.port = self.port or free_port()
        self.ui_port = self.ui_port or free_port()
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="txn-spark-standalone-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = loopback_env(SPARK_WORKER_DIR=str(self.workdir / "work"))
        master = _Process(
            "Spark master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            env,
            self.workdir / "master.log",
        )
        workers = [
            _Process(
                f"Spark worker {n}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    LOOPBACK,
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(self.workdir / f"work-{n}"),
                    self.master_url,
                ],
                env,
                self.workdir / f"worker-{n}.log",
            )
            for n in range(1, self.workers + 1)
        ]
        master.start()
        self._procs.append(master)
        try:
            self._wait(lambda s: s.get("status") == "ALIVE", master, timeout)
            for worker in workers:
                worker.start()
                self._procs.append(worker)
            self._wait(lambda s: s.get("aliveworkers", 0) >= self.workers, workers[-1], timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, running and completed applications)."""
        return dict(_http_json(f"{self.ui_url}/json/"))

    def _wait(self, ready: Any, proc: _Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            try:
                if ready(self.status()):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{proc.name} not ready after {timeout}s:\n{proc.tail()}")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
