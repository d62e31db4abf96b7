"""``tests/unit`` is free of services: a unit test that asks for a server (Postgres, Spark,
Airflow's database) is a collection error; such a test belongs in ``tests/integration``."""

from __future__ import annotations

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
