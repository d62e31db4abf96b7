"""What every test of the plugin's app shares: the dependencies a test stood in for are Airflow's
again afterwards; and ``served``, the app on 127.0.0.1 for a real browser (the test module's
``client`` fixture says which app)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app


@pytest.fixture(autouse=True)
def _clean_overrides():
    yield
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(client) -> Iterator[str]:
    """The plugin's app (as mounted by Airflow's api-server) on 127.0.0.1: its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(client.app, host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.config.port}/transactions"
    server.should_exit = True
    thread.join(timeout=10)
