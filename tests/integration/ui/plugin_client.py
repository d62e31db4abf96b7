"""The plugin's app as Airflow's api-server mounts it, with the dependencies a test stands in for
(not a test module: the UI tests import it)."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_txn_provider.plugins import TxnProviderPlugin
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app


def plugin_client(
    txlog: TransactionLog | None,
    manager: Any = None,
    *,
    user: Any = "someone",
    pipeline_dags: dict[str, frozenset[str]] | None = None,
) -> TestClient:
    """A client of the plugin's app: ``txlog`` the log it opens (``None``: the configured
    connection's), ``manager`` Airflow's auth manager (``None``: nobody logged in) and ``user``
    who asks, ``pipeline_dags`` which DAGs run which pipeline (``None``: as Airflow says)."""
    app = ui_app.app
    app.dependency_overrides.clear()
    if txlog is not None:
        app.dependency_overrides[ui_access.log_opener] = lambda: lambda: txlog
    if pipeline_dags is not None:
        app.dependency_overrides[ui_access.get_pipeline_dags] = lambda: lambda _log: pipeline_dags
    if manager is not None:
        app.dependency_overrides[get_user] = lambda: user
        app.dependency_overrides[ui_access.auth_manager] = lambda: manager
    parent = FastAPI()
    [entry] = TxnProviderPlugin.fastapi_apps
    parent.mount(entry["url_prefix"], entry["app"])
    return TestClient(parent)


class ReadsAll:
    """Airflow's auth manager for a user who may read every DAG."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        return method == "GET"

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return set()
