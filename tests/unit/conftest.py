"""``tests/unit`` is free of services: a unit test that asks for a server (Postgres, Spark,
Airflow's database) is a collection error; such a test belongs in ``tests/integration``."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

SERVICE_FIXTURES = frozenset(
    {"postgres", "db_url", "engine", "txlog", "spark", "connect_server", "airflow_db"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if used and "/unit/" in str(item.path):
            raise pytest.UsageError(
                f"{item.nodeid} is a unit test using the service fixture(s) {sorted(used)}: "
                "move it to tests/integration"
            )


@pytest.fixture
def fake_popen(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``subprocess.Popen`` replaced by a process that exits 0 at once, printing nothing; returns
    what the last one was started with (``cmd`` and Popen's keyword arguments)."""
    started: dict[str, Any] = {}

    class FakePopen:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            started.update(cmd=cmd, **kwargs)
            self.stdout = iter(())
            self.returncode = 0
            self.pid = 0

        def wait(self) -> int:
            return 0

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    return started
