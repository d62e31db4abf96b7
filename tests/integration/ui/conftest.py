"""What every test of the plugin's app shares: the dependencies a test stood in for are Airflow's
again afterwards."""

from __future__ import annotations

import pytest

from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app


@pytest.fixture(autouse=True)
def _clean_overrides():
    yield
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()
