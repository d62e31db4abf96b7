"""TxnLogHook's URL, built on PostgresHook's public API (issue 15): no database needed.

Each connection is an ``AIRFLOW_CONN_*`` variable, read as a task would read it. A wrong URL
(an extra lost, the override not winning, a password not escaped, a default missing) fails here.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from airflow.providers.postgres.hooks.postgres import PostgresHook
from sqlalchemy.engine import make_url

from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.rules.exceptions import TxnConfigError


def _connection(monkeypatch, conn_id: str, **fields) -> TxnLogHook:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "txn_log", **fields})
    )
    return TxnLogHook(txn_log_conn_id=conn_id)


def test_fields_extra_params_and_a_password_with_special_characters(monkeypatch):
    hook = _connection(
        monkeypatch,
        "t_full",
        host="db.internal",
        port=6543,
        login="txn",
        password="p@ss/word",
        schema="txn",
        extra={"sslmode": "require", "connect_timeout": 5, "application_name": "a b"},
    )
    url = make_url(hook.log_url())
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password) == ("txn", "p@ss/word")
    assert (url.host, url.port, url.database) == ("db.internal", 6543, "txn")
    assert dict(url.query) == {
        "sslmode": "require",
        "connect_timeout": "5",
        "application_name": "a b",
    }
    text = hook.log_url()
    assert text.startswith("postgresql+psycopg://txn:p%40ss%2Fword@db.internal:6543/txn?")
    assert hook.sqlalchemy_url == url
    assert hook.get_uri() == text


def test_defaults_when_fields_are_missing(monkeypatch):
    url = _connection(monkeypatch, "t_empty").sqlalchemy_url
    assert (
        url.render_as_string(hide_password=False) == "postgresql+psycopg://127.0.0.1:5432/postgres"
    )
    url = _connection(monkeypatch, "t_noport", host="db", login="u", schema="d").sqlalchemy_url
    assert (url.host, url.port, url.database, url.username, url.password) == (
        "db",
        5432,
        "d",
        "u",
        None,
    )


def test_postgres_hook_options_are_not_libpq_parameters(monkeypatch):
    hook = _connection(
        monkeypatch, "t_reserved", host="db", extra={"sslmode": "disable", "cursor": "dictcursor"}
    )
    assert dict(hook.sqlalchemy_url.query) == {"sslmode": "disable"}


def test_sqlalchemy_url_in_extra_overrides_everything(monkeypatch):
    given = "postgresql://other:s%40cret@elsewhere:7000/logdb?sslmode=verify-full"
    hook = _connection(
        monkeypatch,
        "t_override",
        host="ignored",
        port=1,
        login="ignored",
        password="ignored",
        schema="ignored",
        extra={"sqlalchemy_url": given, "sslmode": "disable"},
    )
    assert hook.log_url() == given  # exactly as given: the job's $TXN_LOG_URL
    assert hook.sqlalchemy_url == make_url(given)
    assert make_url(hook.log_url()).password == "s@cret"


def test_async_url_is_the_same_url_with_psycopg3(monkeypatch):
    hook = _connection(
        monkeypatch,
        "t_async",
        host="db",
        login="u",
        password="p@ss/word",
        extra={"sslmode": "require"},
    )
    url = asyncio.run(hook.async_sqlalchemy_url())
    assert url.drivername == "postgresql+psycopg"
    assert url.set(drivername="postgresql+psycopg") == hook.sqlalchemy_url
    given = "postgresql+psycopg://a:b@c:1/d"
    override = _connection(monkeypatch, "t_async_override", extra={"sqlalchemy_url": given})
    url = asyncio.run(override.async_sqlalchemy_url())
    assert url.render_as_string(hide_password=False) == "postgresql+psycopg://a:b@c:1/d"


def test_a_missing_connection_is_a_config_error(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_T_NOWHERE", raising=False)
    hook = TxnLogHook(txn_log_conn_id="t_nowhere")
    for call in (lambda: hook.sqlalchemy_url, hook.log_url, hook.get_engine):
        with pytest.raises(TxnConfigError, match="'t_nowhere' is missing or unreadable") as err:
            call()
        assert "AIRFLOW_CONN_T_NOWHERE=postgresql://" in str(err.value)
    with pytest.raises(TxnConfigError, match="'t_nowhere' is missing or unreadable"):
        asyncio.run(hook.async_sqlalchemy_url())
    assert hook.test_connection()[0] is False


def test_a_postgres_hook_of_its_own_connection_type(monkeypatch):
    assert issubclass(TxnLogHook, PostgresHook)
    assert TxnLogHook.conn_type == "txn_log" and TxnLogHook.default_conn_name == "txn_log_default"
    assert TxnLogHook().txn_log_conn_id == "txn_log_default"
    assert TxnLogHook("t_positional").get_conn_id() == "t_positional"
    # one engine per URL and process, also through PostgresHook's get_sqlalchemy_engine
    hook = _connection(monkeypatch, "t_engine", host="engine.invalid", password="p@ss/word")
    engine = hook.get_engine()
    assert hook.get_sqlalchemy_engine() is engine
    assert TxnLogHook("t_engine").get_engine() is engine
    assert engine.url.render_as_string(hide_password=False) == hook.log_url()
