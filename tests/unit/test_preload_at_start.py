"""preload_at_start.py: Airflow loads it at the start of its processes through the package's
``airflow.policy`` entry point, and it warms only the processes that fork tasks."""

from __future__ import annotations

from airflow_txn_provider.preload import TASK_MODULES
from tests.unit.test_preload import modules_after


def test_airflow_loads_the_preload_at_start_through_its_policy_entry_point():
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="airflow.policy") if e.name == "airflow_txn_provider"]
    assert point.value == "airflow_txn_provider.preload_at_start"
    # what Airflow's settings.initialize() does: pluggy loads the entry points of the group
    started = "import sys; sys.argv = ['airflow', 'scheduler']\nimport airflow.settings\n"
    at_start = modules_after(started)
    assert set(TASK_MODULES) <= at_start
    assert "airflow.models.asset" in at_start  # an Asset can be made that early
    assert not set(TASK_MODULES) & modules_after(
        "import sys; sys.argv = ['airflow', 'api-server']\nimport airflow.settings\n"
    )
