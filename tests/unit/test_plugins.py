"""The plugin exposes the Transactions app and its two views as Airflow 3.3 expects them, stays
cheap to import, and the app refuses anonymous requests and explains a missing log (no database
needed: these fail before any query)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from airflow.api_fastapi.core_api.datamodels.plugins import (
    ExternalViewResponse,
    FastAPIAppResponse,
)
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_txn_provider.plugins import TxnProviderPlugin
from airflow_txn_provider.timetables import TxidTimetable, txid_run_id
from airflow_txn_provider.ui import LazyApp, reader
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app
from tests.unit.ui.test_access import FakeAuthManager


@pytest.fixture(autouse=True)
def _airflow_dependencies():
    """Each test starts from Airflow's own dependencies, whatever another test on this pytest
    worker stood in for."""
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()


def views_by_destination() -> dict[str, dict]:
    return {view["destination"]: view for view in TxnProviderPlugin.external_views}


def test_plugin_mounts_the_app_at_transactions():
    [entry] = TxnProviderPlugin.fastapi_apps
    FastAPIAppResponse.model_validate({**entry, "app": "x"})
    assert (entry["url_prefix"], entry["name"]) == ("/transactions", "Transactions")
    assert isinstance(entry["app"], LazyApp)
    assert entry["app"].app is ui_app.app
    assert isinstance(ui_app.app, FastAPI)
    assert TxnProviderPlugin.timetables == [TxidTimetable]  # kept


def test_external_views_nav_and_dag_run():
    views = views_by_destination()
    assert set(views) == {"nav", "dag_run"}
    for view in views.values():
        ExternalViewResponse.model_validate(view)  # Airflow's own schema of the plugin API
        assert view["name"] == "Transactions"
        assert view["url_route"]  # the UI shows tabs and routes only for views with one
    assert views["nav"]["href"] == "/transactions/"
    href = views["dag_run"]["href"]
    assert "{DAG_ID}" in href and "{RUN_ID}" in href
    # Keyed by DAG id: build_dag(pipeline, dag_id=...) may name the DAG unlike its pipeline.
    assert href == "/transactions/dags/{DAG_ID}/runs/{RUN_ID}"
    assert views["nav"]["url_route"] != views["dag_run"]["url_route"]


def mounted() -> TestClient:
    """The app mounted as Airflow's api-server mounts plugin apps."""
    parent = FastAPI()
    [entry] = TxnProviderPlugin.fastapi_apps
    parent.mount(entry["url_prefix"], entry["app"])
    return TestClient(parent)


def test_the_dag_run_view_address_is_a_route_of_the_app():
    href = views_by_destination()["dag_run"]["href"]
    url = href.replace("{DAG_ID}", "words").replace("{RUN_ID}", txid_run_id(4))
    response = mounted().get(url)
    assert response.status_code == 401  # a route that wants a user, not a 404


def test_airflow_mounts_the_app_from_the_installed_plugin():
    """Airflow's own plugin loading (entry point) and mounting, as in the api-server."""
    from airflow.api_fastapi.app import init_plugins

    api_server = FastAPI()
    init_plugins(api_server)
    assert "/transactions" in [getattr(route, "path", None) for route in api_server.routes]
    client = TestClient(api_server)
    assert client.get("/transactions/api/pipelines").status_code == 401
    assert client.get("/transactions/static/txn.css").status_code == 200


def test_importing_the_plugin_loads_neither_fastapi_nor_the_app():
    code = (
        "import sys, airflow_txn_provider.plugins; "
        "print([m for m in ('fastapi', 'airflow_txn_provider.ui.app', "
        "'airflow.api_fastapi.core_api.security') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "path",
    [
        "/transactions/",
        "/transactions/pipelines/words",
        "/transactions/pipelines/words/runs/txid-000001",
        "/transactions/dags/words_etl/runs/txid-000001",
        "/transactions/api/pipelines",
        "/transactions/api/pipelines/words",
        "/transactions/api/pipelines/words/txids/1",
    ],
)
def test_anonymous_requests_are_refused(path):
    response = mounted().get(path)
    assert response.status_code == 401
    if "/api/" in path:
        assert response.json() == {"detail": "Not authenticated"}
    else:
        assert "sign in to Airflow" in response.text


def test_an_invalid_token_is_refused(monkeypatch):
    class Manager:
        async def get_user_from_token(self, token):
            import jwt

            raise jwt.InvalidTokenError("bad")

    monkeypatch.setattr("airflow.api_fastapi.core_api.security.get_auth_manager", Manager)
    with_cookie = mounted()
    with_cookie.cookies.set("_token", "x")
    assert with_cookie.get("/transactions/api/pipelines").status_code == 403
    response = mounted().get("/transactions/api/pipelines", headers={"Authorization": "Bearer x"})
    assert response.status_code == 403


@pytest.fixture
def signed_in():
    """Requests as a user who may read every DAG; the log is the configured one."""
    app = ui_app.app
    app.dependency_overrides[get_user] = lambda: "admin"
    app.dependency_overrides[ui_access.auth_manager] = lambda: FakeAuthManager(all_dags=True)
    ui_access.provider.reset()
    yield mounted()
    app.dependency_overrides.clear()
    ui_access.provider.reset()


UNAVAILABLE = "the transaction log is unavailable (see the api-server log)"


def test_a_missing_connection_is_a_503_and_the_server_log_says_what_to_set(
    signed_in, monkeypatch, caplog
):
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "no_such_txn_log")
    response = signed_in.get("/transactions/api/pipelines")
    assert response.status_code == 503
    assert response.json()["detail"] == UNAVAILABLE
    page = signed_in.get("/transactions/")
    assert page.status_code == 503
    assert UNAVAILABLE in page.text and 'class="banner"' in page.text
    said = caplog.text  # the page is generic; the api-server's log says what to set
    assert "'no_such_txn_log'" in said
    assert "AIRFLOW_CONN_NO_SUCH_TXN_LOG" in said
    assert "[txn_provider] ui_txn_log_conn_id" in said


def test_a_database_that_is_down_is_a_503_naming_nothing_of_it(signed_in, monkeypatch, caplog):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv(
        "AIRFLOW_CONN_TXN_LOG_DEFAULT",
        json.dumps(
            {
                "conn_type": "txn_log",
                "host": "127.0.0.1",
                "port": port,
                "schema": "txn",
                "login": "u",
            }
        ),
    )
    monkeypatch.setattr(reader, "PAGE_OUTAGE_TIMEOUT", 0.2)
    response = signed_in.get("/transactions/api/pipelines/words")
    assert response.status_code == 503
    assert response.json()["detail"] == UNAVAILABLE
    assert "127.0.0.1" not in response.text and str(port) not in response.text
    assert "cannot be reached" in caplog.text and "'txn_log_default'" in caplog.text
    assert f"port {port}" in caplog.text


def test_the_conn_id_option_defaults_to_txn_log_default(monkeypatch):
    monkeypatch.delenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", raising=False)
    assert reader.configured_conn_id() == "txn_log_default"
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "other")
    assert reader.configured_conn_id() == "other"


def test_static_files_are_served_without_a_database():
    client = mounted()
    assert "fetch(" in client.get("/transactions/static/txn.js").text
    assert client.get("/transactions/static/txn.css").status_code == 200
    icon = TxnProviderPlugin.external_views[0]["icon"]
    assert client.get(icon).headers["content-type"].startswith("image/svg+xml")
