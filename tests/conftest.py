"""Shared fixtures: a throwaway Postgres server started once per test session.

The server runs from the Debian PostgreSQL binaries on 127.0.0.1 (see
txn_testing.postgres). Each test that needs a database gets a fresh one, cloned
from a template that already holds the migrated transaction-log schema.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hypothesis  # noqa: F401  (imported early: see below)
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from airflow_txn_provider.log import schema
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from txn_testing.postgres import EmbeddedPostgres

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txn_testing.spark import SparkConnectServer

# Airflow reads its home at import: keep it (and its airflow.cfg) out of ~/airflow. Spark binds
# 127.0.0.1 only: no test traffic leaves loopback. One home per pytest-xdist worker: a worker
# inherits the controller's environment, and two workers' dag.test() on one sqlite database and
# dags folder raced (an IntegrityError on table dag when two DAG files synced at once).
if os.environ.get("PYTEST_XDIST_WORKER") or "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="txn-airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["SPARK_LOCAL_HOSTNAME"] = "localhost"
# py4j logs at INFO from __del__ at interpreter exit, after pytest closed its log streams.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Importing hypothesis here, not lazily in its plugin's terminal summary, avoids CPython 3.11.7's
# "AST constructor recursion depth mismatch" (gh-106905) when a run collects no hypothesis test.

TEMPLATE_DB = "txn_template"
_db_counter = itertools.count(1)


AIRFLOW_STACKS = frozenset(
    {
        "test_airflow_e2e.py",
        "test_browser.py",
        "test_celery_cluster.py",
        "test_chaos_airflow.py",
        "test_credentials.py",
        "test_fill_airflow.py",
        "test_demo_airflow.py",
        "test_kafka_airflow.py",
        "test_timetables_migrate_runs.py",
        "test_ui_buttons.py",
    }
)
"""Integration test files that start a whole Airflow (scheduler, triggerer, api-server, …)."""


def _starts_airflow(path: str) -> bool:
    return "/integration/" in path and Path(path).name in AIRFLOW_STACKS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark integration tests, and put those that start a whole Airflow first (see below), the
    ones on the shared deployment (``tests/integration/conftest.py``) first of all: it stops
    after the last of them, so no other Airflow test runs beside it, idle but polling."""
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)

    def order(item: pytest.Item) -> tuple[bool, bool]:
        shared = "shared_airflow" in getattr(item, "fixturenames", ())
        return (not _starts_airflow(str(item.path)), not shared)

    items.sort(key=order)  # stable: order kept otherwise


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s ``--dist loadfile`` on two pytest-xdist workers, with one change: the
    tests that start a whole Airflow are one unit, run first and one after another on one
    worker, while the other worker runs the rest a file at a time. Two Airflow deployments at
    once on two cores starve each other's timing-bound waits. (xdist's own ``loadgroup`` marks
    do not reach its scheduler under pytest 9.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist reorders scopes by their number of tests, which put this unit of five tests last
    # (one worker then ran the Airflow tests alone for the last minutes): keep collection order
    config.option.loadscopereorder = False

    class AirflowApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "airflow" if _starts_airflow(path) else path

    return AirflowApart(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failure is reported whatever its traceback: should pytest's formatting of it fail
    (CPython 3.11's ``SystemError: AST constructor recursion depth mismatch``, gh-106905, when
    anything interrupts its parse of a long traceback's sources; a ``RecursionError`` deep in
    it), the report falls back to Python's own formatting, then to the exception's repr,
    instead of crashing the xdist worker and losing the failure and every test after it."""
    try:
        return (yield)
    except Exception as err:
        from _pytest.reports import TestReport

        excinfo = call.excinfo
        try:
            import traceback

            shown = "".join(traceback.format_exception(excinfo.value)) if excinfo else ""
        except Exception:
            shown = repr(excinfo.value) if excinfo else ""
        longrepr = f"{shown}\n(pytest could not format this failure: {err!r})"
        return TestReport(
            item.nodeid,
            item.location,
            dict.fromkeys(item.keywords, 1),
            "failed",
            longrepr,
            call.when,
            duration=call.duration,
            start=call.start,
            stop=call.stop,
        )


class _Unreported:
    """On the xdist controller: the tests the workers collected that never reported a result
    (a crashed worker, an aborted session), named at the end and failing the run."""

    def __init__(self) -> None:
        self.collected: set[str] = set()
        self.reported: set[str] = set()

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected.update(ids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.reported.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if terminalreporter.config.option.maxfail:  # -x, --maxfail: stopped on purpose
            return
        missing = sorted(self.collected - self.reported)
        if missing:
            terminalreporter.section(f"{len(missing)} tests did not run", red=True)
            for nodeid in missing:
                terminalreporter.line(nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.collected - self.reported and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        if not hasattr(config, "workerinput"):  # the controller
            config.pluginmanager.register(_Unreported(), "txn-unreported")


@pytest.fixture(autouse=True)
def _no_spark_connect_mode_left_behind() -> Iterator[None]:
    """A test leaves no Spark Connect mark in the process (PySpark's ``SPARK_CONNECT_MODE_ENABLED``
    and kin, set by any remote session, never unset by PySpark): every later classic session of
    the process would turn into a Connect client and fail (``SESSION_ALREADY_EXIST``), in
    whichever test ``--dist loadfile`` puts next on this worker. Such a test fails here, by name,
    and the marks are undone; a remote session is opened with
    :func:`~airflow_txn_provider.spark.connect_sessions.connect_session`."""
    from airflow_txn_provider.spark.job import CONNECT_MODE_ENV

    before = {name: os.environ.get(name) for name in CONNECT_MODE_ENV}
    yield
    left = {n: os.environ.get(n) for n in CONNECT_MODE_ENV if os.environ.get(n) != before[n]}
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if left:
        pytest.fail(
            f"the test left PySpark's Spark Connect marks {sorted(left)} in the process: open "
            "remote sessions with airflow_txn_provider.spark.connect_sessions.connect_session",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(durable=False) as pg:
        admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {TEMPLATE_DB}"))
        admin.dispose()
        template = create_engine(_db_url(pg, TEMPLATE_DB))
        schema.upgrade(template)
        template.dispose()
        yield pg


def _db_url(pg: EmbeddedPostgres, name: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/{name}"


def new_database(pg: EmbeddedPostgres, *, migrated: bool = True) -> str:
    """Create a fresh database and return its URL."""
    name = f"t{next(_db_counter)}"
    admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        template = f" TEMPLATE {TEMPLATE_DB}" if migrated else ""
        conn.execute(text(f"CREATE DATABASE {name}{template}"))
    admin.dispose()
    return _db_url(pg, name)


@pytest.fixture
def db_url(postgres: EmbeddedPostgres) -> str:
    return new_database(postgres)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def txlog(engine: Engine) -> TransactionLog:
    return TransactionLog(engine)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A classic local SparkSession (one JVM for the whole test session)."""
    from pyspark.sql import SparkSession

    # its Python workers on this Python, not the PATH's (make test-matrix's cells run others)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("txn-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    """A Spark Connect server (local[2]) from the pip package, shared by the session. PySpark 3.5
    (cells of ``make test-matrix``) ships no Connect server, and the provider refuses Connect
    there: skipped."""
    from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT
    from txn_testing.spark import SparkConnectServer

    if not SUPPORTS_CONNECT:
        pytest.skip("Spark Connect: PySpark 4.0 and later (compat/spark.py)")

    with SparkConnectServer(workdir=tmp_path_factory.mktemp("connect")) as server:
        yield server


def set_txn_log_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, url: str, **extra: str
) -> None:
    """Expose the database at ``url`` as Airflow connection ``conn_id`` of type ``txn_log``."""
    from txn_testing.airflow import txn_log_connection_env

    for key, value in txn_log_connection_env(conn_id, url, **extra).items():
        monkeypatch.setenv(key, value)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    stack: Any = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``predicate`` every second until it returns something true (returned); ``ignore``
    lists exceptions that mean "not yet". The assertion names what was awaited, with the
    Airflow ``stack``'s log tails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        time.sleep(1)
    tail = stack.tail() if stack is not None else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tail}")


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Airflow's own metadata DB (sqlite in the session's AIRFLOW_HOME), migrated once: what
    ``dag.test()`` needs."""
    import subprocess
    import sys
    from pathlib import Path

    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=600)


def load_dag_file(path: Any) -> Any:
    """Import a DAG file for ``dag.test()``, which parses it again from the dags folder Airflow
    read at start: the file is linked there first. Returns the module."""
    import importlib.util
    from pathlib import Path

    from airflow import settings

    path = Path(path)
    folder = Path(settings.DAGS_FOLDER)
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / path.name
    if not link.exists():
        link.symlink_to(path)
    spec = importlib.util.spec_from_file_location(f"dagfile_{link.stem}", link)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
