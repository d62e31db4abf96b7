"""Warming task processes: only the processes that fork tasks import the task modules, and the
image's airflow_local_settings.py is the one the tested stack writes."""

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
from txn_testing.airflow import LOCAL_SETTINGS

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


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_warming_imports_the_task_modules_and_nothing_otherwise():
    warm = "from airflow_txn_provider.preload import warm_task_processes as w\n"
    assert set(TASK_MODULES) <= _modules_after(warm + "w(['airflow', 'scheduler'])")
    cold = _modules_after(warm + "w(['airflow', 'api-server'])")
    assert not set(TASK_MODULES + PARSE_MODULES) & cold
    assert "pyspark" not in cold
    parsers = _modules_after(warm + "w(['airflow', 'dag-processor'])")
    assert set(PARSE_MODULES) <= parsers and "pyspark" not in parsers
    # what the preload is for: the Postgres provider, most of a DAG file's parse
    assert "airflow.providers.postgres.hooks.postgres" in parsers


def test_a_module_that_is_missing_is_skipped(monkeypatch):
    import airflow_txn_provider.preload as preload

    monkeypatch.setattr(preload, "TASK_MODULES", ("json", "no_such_module_here"))
    monkeypatch.setattr(preload, "PARSE_MODULES", ("no_such_parser_module",))
    assert warm_task_processes(force=True) == ["json"]


def test_the_image_warms_its_task_processes_as_the_tested_stack_does():
    def code(text: str) -> list[str]:
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    image = (ROOT / "docker" / "airflow_local_settings.py").read_text()
    assert code(image) == code(LOCAL_SETTINGS)
    copy = "COPY docker/airflow_local_settings.py /opt/airflow/config/airflow_local_settings.py"
    assert copy in (ROOT / "docker" / "Dockerfile").read_text()
