"""TxnLogHook against a real Postgres, through a real Airflow connection (environment variable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.sources import TransactionalSource
from tests.conftest import set_txn_log_connection


class One(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"n": txid}


def test_log_from_airflow_connection(monkeypatch, db_url):
    set_txn_log_connection(monkeypatch, "txn_log_test", db_url)
    hook = TxnLogHook(txn_log_conn_id="txn_log_test")
    assert hook.test_connection() == (True, "Connection successfully tested")
    log = hook.get_log()
    log.register_pipeline("hooked", source_kind="transactional", max_pending=2)
    assert log.begin("hooked", 1, One()).emitted
    assert str(log.engine.url.database) == make_url(db_url).database


def test_unreachable_database_is_reported(monkeypatch, db_url):
    url = make_url(db_url).set(port=1)
    set_txn_log_connection(
        monkeypatch, "txn_log_down", url.render_as_string(hide_password=False), connect_timeout="2"
    )
    ok, message = TxnLogHook(txn_log_conn_id="txn_log_down").test_connection()
    assert not ok and "127.0.0.1" in message and "1" in message


def test_provider_is_registered(tmp_path: Path):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    out = subprocess.run(
        ["airflow", "providers", "get", "airflow-txn-provider", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    info = json.loads(out)
    assert info[0]["Provider"] == "airflow-txn-provider"
    hooks = subprocess.run(
        ["airflow", "providers", "hooks", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert any(
        h["connection_type"] == "txn_log"
        and h["class"] == "airflow_txn_provider.hooks.txn_log.TxnLogHook"
        for h in json.loads(hooks)
    ), hooks[:500]
