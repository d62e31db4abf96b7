"""Warming task processes: only the processes that fork tasks import the task modules, Airflow
does it at start through the package's ``airflow.policy`` entry point (preload_at_start.py:
test_preload_at_start.py), and it can be turned off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_txn_provider.preload import (
    PARSE_MODULES,
    TASK_MODULES,
    forks_task_processes,
    modules_to_preload,
    warm_task_processes,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["airflow", "scheduler"], True),
        (["airflow", "celery", "worker", "--concurrency", "2"], True),
        (["airflow", "--verbose", "scheduler"], True),
        (["airflow", "api-server"], False),
        (["airflow", "triggerer"], False),
        (["airflow", "dag-processor"], False),
        (["airflow", "db", "migrate"], False),
        (["airflow", "celery", "flower"], False),
        (["airflow"], False),
    ],
)
def test_only_processes_that_fork_tasks_preload(argv, expected):
    assert forks_task_processes(argv) is expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["airflow", "scheduler"], TASK_MODULES + PARSE_MODULES),
        (["airflow", "celery", "worker"], TASK_MODULES + PARSE_MODULES),
        (["airflow", "dag-processor"], PARSE_MODULES),
        (["airflow", "triggerer"], ()),
        (["airflow", "api-server"], ()),
    ],
)
def test_the_dag_processor_preloads_what_a_dag_file_imports(argv, expected):
    assert modules_to_preload(argv) == expected


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_warming_imports_the_task_modules_and_nothing_otherwise():
    warm = "from airflow_txn_provider.preload import warm_task_processes as w\n"
    assert set(TASK_MODULES) <= modules_after(warm + "w(['airflow', 'scheduler'])")
    cold = modules_after(warm + "w(['airflow', 'api-server'])")
    assert not set(TASK_MODULES + PARSE_MODULES) & cold
    assert "pyspark" not in cold
    parsers = modules_after(warm + "w(['airflow', 'dag-processor'])")
    assert set(PARSE_MODULES) <= parsers and "pyspark" not in parsers
    # what the preload is for: the Postgres provider, most of a DAG file's parse
    assert "airflow.providers.postgres.hooks.postgres" in parsers
    # and the asset handlers the first Asset of a process loads (the waker's, in each parse)
    assert "airflow.models.asset" in parsers


def test_a_process_that_forks_tasks_builds_their_supervisors_ssl_context_once():
    """The Task SDK's client builds an SSL context per process, cached: warmed in the scheduler
    (or a Celery worker), every supervisor it forks finds it built."""
    code = (
        "import os\n"
        "from airflow_txn_provider.preload import warm_task_processes\n"
        "from airflow.sdk.api.client import Client\n"
        "warm_task_processes(['airflow', 'scheduler'])\n"
        "warmed = Client._get_ssl_context_cached.cache_info().currsize\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    client = Client(base_url='http://127.0.0.1:1/execution/', token='t')\n"
        "    info = Client._get_ssl_context_cached.cache_info()\n"
        "    os._exit(0 if (info.hits, info.currsize) == (1, 1) else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(warmed, os.waitstatus_to_exitcode(status))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert out[-2:] == ["1", "0"]  # built once before the fork; the child's client reused it


def test_a_module_that_is_missing_is_skipped(monkeypatch):
    import airflow_txn_provider.preload as preload

    monkeypatch.setattr(preload, "TASK_MODULES", ("json", "no_such_module_here"))
    monkeypatch.setattr(preload, "PARSE_MODULES", ("no_such_parser_module",))
    assert warm_task_processes(force=True) == ["json"]


def test_the_preload_can_be_turned_off(monkeypatch):
    from airflow_txn_provider.preload import warm_at_start

    off = "import os; os.environ['AIRFLOW__TXN_PROVIDER__PRELOAD_TASK_PROCESSES'] = 'False'\n"
    started = "import sys; sys.argv = ['airflow', 'scheduler']\nimport airflow.settings\n"
    assert not set(TASK_MODULES) & modules_after(off + started)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__PRELOAD_TASK_PROCESSES", "False")
    assert warm_at_start(["airflow", "scheduler"]) == []
