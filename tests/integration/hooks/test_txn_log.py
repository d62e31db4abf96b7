"""TxnLogHook against a real Postgres, through a real Airflow connection (environment variable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.rules.sources import TransactionalSource
from tests.conftest import set_txn_log_connection


class One(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"n": txid}


def test_log_from_airflow_connection(monkeypatch, db_url):
    set_txn_log_connection(monkeypatch, "txn_log_test", db_url)
    hook = TxnLogHook(txn_log_conn_id="txn_log_test")
    assert hook.test_connection() == (True, "Connection successfully tested")
    txlog = hook.get_log()
    txlog.register_pipeline("hooked", source_kind="transactional", max_pending=2)
    assert txlog.begin("hooked", 1, One()).emitted
    assert str(txlog.engine.url.database) == make_url(db_url).database


def test_unreachable_database_is_reported(monkeypatch, db_url):
    url = make_url(db_url).set(port=1)
    set_txn_log_connection(
        monkeypatch, "txn_log_down", url.render_as_string(hide_password=False), connect_timeout="2"
    )
    ok, message = TxnLogHook(txn_log_conn_id="txn_log_down").test_connection()
    assert not ok and "127.0.0.1" in message and "1" in message


def _airflow(args, env):
    return subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


PACKAGE = "airflow-txn-provider"


def test_connection_types_and_plugin_are_registered(tmp_path: Path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    # One CLI start per question (each ~10-20 s of CI's cores): the provider's hooks (each
    # listed with the provider that registered it), its plugins
    got = _airflow(["providers", "hooks", "-o", "json"], env)
    assert got.returncode == 0, got.stderr[-2000:]
    types = {h["connection_type"]: (h["class"], h["package_name"]) for h in json.loads(got.stdout)}
    assert types["txn_log"] == ("airflow_txn_provider.hooks.txn_log.TxnLogHook", PACKAGE)
    assert types["airflow_api"] == (
        "airflow_txn_provider.hooks.airflow_api.AirflowApiHook",
        PACKAGE,
    )
    plugins = _airflow(["plugins", "-o", "json"], env)
    assert "TxidTimetable" in plugins.stdout, plugins.stdout[-2000:]
    # Registered once, also when providers are discovered eagerly (which loads the plugins that
    # providers declare as well as the entry points')
    eager = {**env, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
    code = (
        "import json; from airflow import plugins_manager as m; "
        "p, e = m._get_plugins(); print(json.dumps([[x.name for x in p], e], default=str))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], env=eager, cwd=tmp_path, capture_output=True, text=True
    )
    names, errors = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert names.count("airflow_txn_provider") == 1, loaded.stdout
    # The OpenLineage provider (in the lock, for lineage) declares its plugin both ways, and
    # eager discovery then skips its second registration: a notice of theirs, not an error here
    others = {
        k: v for k, v in errors.items() if not str(v).endswith("already registered, skipping")
    }
    assert not others and not [k for k in errors if "txn" in k], errors


def test_broken_connection_is_a_clear_error_not_a_broken_airflow(tmp_path: Path, monkeypatch):
    from airflow_txn_provider.rules.exceptions import TxnConfigError

    broken = "{not json"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONN_TXN_LOG_DEFAULT": broken}
    listed = _airflow(["providers", "list", "-o", "json"], env)  # every command still works
    assert listed.returncode == 0, listed.stderr[-2000:]
    monkeypatch.setenv("AIRFLOW_CONN_TXN_LOG_DEFAULT", broken)
    with pytest.raises(TxnConfigError, match="'txn_log_default' is missing or unreadable") as err:
        TxnLogHook().get_log()
    assert "AIRFLOW_CONN_TXN_LOG_DEFAULT=postgresql://" in str(err.value)
    monkeypatch.delenv("AIRFLOW_CONN_TXN_LOG_DEFAULT")
    with pytest.raises(TxnConfigError, match="missing or unreadable"):
        TxnLogHook(txn_log_conn_id="nowhere").get_log()
