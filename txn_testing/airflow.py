"""A real Airflow deployment on loopback, for end-to-end tests, benchmarks and the demo.

Starts ``airflow db migrate``, then the scheduler, dag-processor, triggerer and api-server as
separate processes, each in its own process group with its log in ``home/logs``, on a Postgres
metadata database. The executor is the LocalExecutor (tasks run under the scheduler) or, with a
broker URL, the CeleryExecutor with ``celery_workers`` separate ``airflow celery worker``
processes, each its own "host" (:func:`worker_hostname`) as on a cluster. Login is Airflow's
simple auth manager with one admin user. Nothing listens anywhere but 127.0.0.1.

Like a production deployment (systemd ``Restart=always``, Kubernetes), the stack restarts a
component that exits by itself (:attr:`AirflowStack.restarts` counts it); a component stopped
on purpose (:meth:`AirflowStack.kill`) stays down until :meth:`AirflowStack.start_component`.
The Airflow settings that bound how fast a deployment heals are :data:`HEALING_SETTINGS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from airflow_txn_provider.failure_injection import ENABLE_ENV as FAILURE_INJECTION_ENV
from txn_testing.postgres import free_port

COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
CELERY_WORKER = "celery-worker-{}"
"""Component name (and Airflow hostname) of the ``n``-th Celery worker, from 1."""
WORKER_HOSTNAME_ENV = "TXN_WORKER_HOSTNAME"
REPOSITORY = Path(__file__).resolve().parents[1]
"""The folder that holds this package (it is not installed: see the package's docstring)."""


def worker_hostname() -> str:
    """Airflow's ``[core] hostname_callable`` for the test's Celery workers: each is a "host" of
    its own (they share one machine here), so a task instance's ``hostname`` names its worker."""
    from airflow.utils.net import getfqdn

    return os.environ.get(WORKER_HOSTNAME_ENV) or getfqdn()


ADMIN_USER = "admin"

HEALING_SETTINGS = {
    # A restarted scheduler resets the task instances of a dead one (LocalExecutor's tasks die
    # with it) once that one's heartbeat is this old, checking this often: ~30 s, not 5 minutes.
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    # A task whose process died without its scheduler is failed (then retried) after 60 s.
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    # A restarted triggerer takes over a dead one's triggers once it has been silent this long.
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
}
"""Airflow settings that bound the time to heal after a scheduler, triggerer or worker dies
(docs/airflow.md, "Faults and how long they take to heal"); the demo and docker/ set them too."""


def connection_env(conn_id: str, **fields: Any) -> dict[str, str]:
    """An Airflow connection as an ``AIRFLOW_CONN_*`` variable (JSON form)."""
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(fields)}


def txn_log_connection_env(conn_id: str, url: str, **extra: str) -> dict[str, str]:
    """The Postgres database at ``url`` as a ``txn_log`` connection (see ``TxnLogHook``)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    fields: dict[str, Any] = {"host": u.host, "port": u.port, "login": u.username}
    if u.password:
        fields["password"] = u.password
    if extra:
        fields["extra"] = extra
    return connection_env(conn_id, conn_type="txn_log", schema=u.database, **fields)


class AirflowStack:
    """
    :param home: ``AIRFLOW_HOME`` (created; holds logs, passwords file and airflow.cfg).
    :param metadata_url: SQLAlchemy URL of an empty Postgres database for Airflow's metadata.
    :param dags_folder: the DAG files.
    :param env: extra environment (connections, Variables, provider settings).
    :param password: the admin user's password.
    :param failure_injection: let the Variables ``txn_inject_failure__<pipeline>`` fail chosen
        attempts (:mod:`airflow_txn_provider.failure_injection`); off for benchmarks.
    :param preload: warm the task processes (:mod:`airflow_txn_provider.preload`), as Airflow
        does with the provider installed; ``False``: ``[txn_provider] preload_task_processes``
        off, every task process imports the Spark Connect client itself.
    :param users: more users of the simple auth manager, name -> (role, password): ``viewer``,
        ``user``, ``op`` or ``admin`` (the admin user is always there).
    :param celery_broker: a Celery broker URL (e.g. :class:`~.redis.RedisServer`'s): run the
        CeleryExecutor with ``celery_workers`` workers of ``celery_concurrency`` slots each,
        results in the metadata database; ``None``: the LocalExecutor.
    """

    def __init__(
        self,
        home: Path,
        metadata_url: str,
        dags_folder: Path,
        *,
        env: Mapping[str, str] | None = None,
        password: str = "admin",
        port: int | None = None,
        parallelism: int = 8,
        failure_injection: bool = True,
        preload: bool = True,
        celery_broker: str | None = None,
        celery_workers: int = 2,
        celery_concurrency: int = 4,
        users: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self.home = Path(home)
        self.users = {ADMIN_USER: ("admin", password), **(users or {})}
        self.preload = preload
        self.metadata_url = metadata_url
        self.dags_folder = Path(dags_folder)
        self.extra_env = dict(env or {})
        self.password = password
        self.port = port or free_port()
        self.parallelism = parallelism
        self.failure_injection = failure_injection
        self.celery_broker = celery_broker
        self.celery_concurrency = celery_concurrency
        workers = range(1, celery_workers + 1) if celery_broker else range(0)
        self.components = COMPONENTS + tuple(CELERY_WORKER.format(n) for n in workers)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = dict.fromkeys(self.components, 0)
        """Times each component exited by itself and was started again."""
        self._down: set[str] = set()  # stopped on purpose: not restarted
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            # Airflow's async engine defaults to asyncpg; psycopg 3 (async too) is installed
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": _psycopg3(self.metadata_url),
            **self._executor_env(),
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{name}:{role}" for name, (role, _) in self.users.items()
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "txn-test-secret-not-for-production",
            # A new DAG file is found within 5 s. Files are parsed again every 30 s and the
            # scheduler sleeps 1 s when it has nothing to do: Airflow's defaults (10 s and 0.2 s
            # cost an idle deployment 25 % of a core, against 11 %, on a machine of two cores).
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            **HEALING_SETTINGS,
            **(FAILURE_INJECTION_ENV if self.failure_injection else {}),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_AIRFLOW_API_DEFAULT": json.dumps(
                {
                    "conn_type": "airflow_api",
                    "host": "127.0.0.1",
                    "port": self.port,
                    "login": ADMIN_USER,
                    "password": self.password,
                }
            ),
            # the provider preloads by itself, as in compose.yaml; off only when asked
            **({} if self.preload else {"AIRFLOW__TXN_PROVIDER__PRELOAD_TASK_PROCESSES": "False"}),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        env.update(self.extra_env)
        return env

    def _executor_env(self) -> dict[str, str]:
        if not self.celery_broker:
            return {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
        from sqlalchemy.engine import make_url

        results = make_url(self.metadata_url).set(drivername="postgresql+psycopg2")
        return {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.celery_broker,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+"
            + results.render_as_string(hide_password=False),
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.celery_concurrency),
            # A worker takes one task per free slot, none ahead: a queued task goes to whichever
            # worker is free (and is not stranded behind a long job, or on a worker that dies).
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.worker_hostname",
            # Every component imports that callable, from this package: the repository's, not
            # installed with the provider, so the components get the repository on their path.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])
            ),
        }

    def component_argv(self, name: str) -> list[str]:
        """The ``airflow`` sub-command that runs one component."""
        if name == "api-server":
            return [name, "--port", str(self.port)]
        if name.startswith(CELERY_WORKER.format("")):
            # Logs are read from the shared AIRFLOW_HOME/logs: no log server (no port to share).
            return ["celery", "worker", "--celery-hostname", f"{name}@%h", "--skip-serve-logs"]
        return [name]

    def airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run one ``airflow`` command in this deployment; raise with its output if it fails."""
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
            )
        return proc

    def start(self, timeout: float = 240) -> AirflowStack:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        passwords = {name: password for name, (_, password) in self.users.items()}
        (self.home / "passwords.json").write_text(json.dumps(passwords))
        self.airflow("db", "migrate")
        # Runs of pipelines from before 0.2 onto the millisecond grid (a no-op when none are)
        subprocess.run(
            [sys.executable, "-m", "airflow_txn_provider.timetables", "migrate-runs"],
            env=self.env(),
            check=True,
            capture_output=True,
            timeout=600,
        )
        for name in self.components:
            self.start_component(name)
        self.wait_healthy(timeout)
        threading.Thread(target=self._supervise, name="airflow-supervisor", daemon=True).start()
        return self

    def start_component(self, name: str) -> None:
        """Start one component (again)."""
        env = self.env()
        if name.startswith(CELERY_WORKER.format("")):
            env[WORKER_HOSTNAME_ENV] = name
        log = open(self.home / "logs" / f"{name}.log", "ab")  # the child keeps it open
        with self._lock:
            if self._stopping:  # the supervisor lost a race with stop(): start nothing
                log.close()
                return
            self.procs[name] = subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), *self.component_argv(name)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._down.discard(name)
        log.close()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> list[int]:
        """Stop one component's whole process group (SIGKILL: a crash, with the task processes a
        LocalExecutor scheduler runs); it stays down until :meth:`start_component`. Returns the
        pids of the descendants signalled with it."""
        with self._lock:
            self._down.add(name)
            proc = self.procs[name]
        # Its task processes too, wherever their process group is (a LocalExecutor's tasks die
        # with their scheduler: that is the fault).
        descendants = _descendants(proc.pid)
        for pid in descendants:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        _signal_group(proc, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(10)
        return descendants

    def _supervise(self) -> None:
        while not self._stopping:
            time.sleep(1)
            for name in self.components:
                with self._lock:
                    proc = self.procs.get(name)
                    if self._stopping or proc is None or name in self._down:
                        continue
                    code = proc.poll()
                    if code is None:
                        continue
                    self.restarts[name] += 1
                with open(self.home / "logs" / f"{name}.log", "a") as out:
                    out.write(f"\n--- supervisor: {name} exited {code}; restarting\n")
                self.start_component(name)

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                last = httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).json()
                states = {k: v.get("status") for k, v in last.items() if isinstance(v, dict)}
                if all(states.get(k) == "healthy" for k in ("metadatabase", "scheduler")) and (
                    states.get("triggerer") == "healthy"
                ):
                    return
            except httpx.HTTPError as err:
                last = err
            time.sleep(1)
        raise TimeoutError(f"Airflow not healthy after {timeout:.0f} s: {last}\n{self.tail()}")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self._down:
                raise RuntimeError(f"airflow {name} exited {proc.returncode}\n{self.tail(name)}")

    def tail(self, *names: str, lines: int = 40) -> str:
        """The components' log tails (all of them unless ``names``), then the log database's
        sessions: what a stalled run's report needs."""
        out = []
        for name in names or tuple(self.procs):
            path = self.home / "logs" / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} ---\n" + "\n".join(text))
        if not names:
            out.append(self.log_sessions())
        return "\n".join(out)

    def log_sessions(self) -> str:
        """The transaction log's Postgres sessions (``txn_log_default``): each one's state, what
        it waits for and who blocks it, so a stall that waits on a lock says whose."""
        raw = self.extra_env.get("AIRFLOW_CONN_TXN_LOG_DEFAULT")
        if not raw:
            return ""
        try:
            from sqlalchemy import URL, create_engine, text

            c = json.loads(raw)
            url = URL.create(
                "postgresql+psycopg",
                c.get("login"),
                c.get("password"),
                c.get("host"),
                c.get("port"),
                c.get("schema"),
            )
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    rows = conn.execute(
                        text(
                            "SELECT pid, application_name, state, wait_event_type, wait_event, "
                            "pg_blocking_pids(pid) AS blocked_by, now() - xact_start AS in_xact, "
                            "left(query, 160) AS query FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    ).all()
            finally:
                engine.dispose()
        except Exception as err:  # a report: never the reason a test fails
            return f"--- log sessions ---\n(not read: {err!r})"
        head = "--- log sessions (pid | app | state | wait | blocked by | in xact | query) ---"
        lines = [" | ".join(str(v) for v in row) for row in rows] or ["(none)"]
        return "\n".join([head, *lines])

    def client(self) -> AirflowClient:
        return AirflowClient(self.url, ADMIN_USER, self.password)

    _stopping = False

    def stop(self, timeout: float = 30) -> None:
        """SIGINT each component's process group (as Ctrl-C does), SIGKILL what is left."""
        with self._lock:
            self._stopping = True
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGINT)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()

    def __enter__(self) -> AirflowStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _psycopg3(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class AirflowClient:
    """The REST calls tests make, as a user of the UI would (login, unpause, clear, read runs)."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.url = url
        token = httpx.post(
            f"{url}/auth/token", json={"username": user, "password": password}, timeout=30
        )
        token.raise_for_status()
        self.http = httpx.Client(
            base_url=f"{url}/api/v2",
            headers={"Authorization": f"Bearer {token.json()['access_token']}"},
            # a person's click waits; under a loaded CI's two cores the one api-server worker
            # (which also serves every task's execution API) has taken over 60 s to answer
            timeout=120,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:1000]}")
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.http.get(f"/dags/{dag_id}")
            if response.status_code == 200:
                return dict(response.json())
            time.sleep(1)
        raise TimeoutError(f"DAG {dag_id} not parsed after {timeout:.0f} s")

    def unpause(self, dag_id: str) -> None:
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": True})

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        found = self.call("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})
        return list(found["dag_runs"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        found = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return list(found["task_instances"])

    def clear_run(self, dag_id: str, run_id: str) -> Any:
        """The call the UI's Clear button on a run makes."""
        return self.call("POST", f"/dags/{dag_id}/dagRuns/{run_id}/clear", json={"dry_run": False})

    def set_variable(self, key: str, value: str) -> None:
        response = self.http.patch(f"/variables/{key}", json={"key": key, "value": value})
        if response.status_code == 404:
            self.call("POST", "/variables", json={"key": key, "value": value})
        elif response.status_code >= 400:
            raise RuntimeError(f"variable {key}: {response.status_code} {response.text[:500]}")

    def delete_variable(self, key: str) -> None:
        response = self.http.delete(f"/variables/{key}")
        if response.status_code not in (204, 404):
            raise RuntimeError(f"variable {key}: {response.status_code} {response.text[:500]}")
