"""Airflow hook: the transaction log (and its SQLAlchemy engine) from an Airflow connection."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL, make_url

from airflow_txn_provider.exceptions import TxnConfigError
from airflow_txn_provider.transaction_log import TransactionLog, engine_from_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


_ENGINES: dict[str, Engine] = {}
"""One engine (and connection pool) per log URL and process: a task opens the log several times
(claim, lease renewals, staging, commit) and each hook used to build, and never dispose, its own."""
# A forked child must not share the parent's pooled connections: it starts with no engine.
os.register_at_fork(after_in_child=_ENGINES.clear)


class TxnLogHook(BaseHook):
    """Opens the Postgres transaction log described by an Airflow connection.

    The connection (type ``txn_log``) holds host, port, login, password and, in *schema*, the
    database name. Extra keys are passed as libpq parameters (e.g. ``{"sslmode": "require"}``);
    ``{"sqlalchemy_url": "..."}`` in extra overrides everything else.

    :param txn_log_conn_id: the Airflow connection id (default ``txn_log_default``).
    """

    conn_name_attr = "txn_log_conn_id"
    default_conn_name = "txn_log_default"
    conn_type = "txn_log"
    hook_name = "Transaction log (Postgres)"

    def __init__(self, txn_log_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.txn_log_conn_id = txn_log_conn_id
        self._engine: Engine | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database"},
            "placeholders": {
                "host": "127.0.0.1",
                "port": "5432",
                "schema": "postgres",
                "extra": '{"sslmode": "prefer"}',
            },
        }

    def sqlalchemy_url(self) -> URL | str:
        try:
            conn = self.get_connection(self.txn_log_conn_id)
        except Exception as err:
            raise _connection_error(self.txn_log_conn_id, err) from None
        return _url(conn)

    async def async_sqlalchemy_url(self) -> URL:
        """The URL with psycopg 3's async driver, for triggers (connection looked up async)."""
        try:
            conn = await self.aget_connection(self.txn_log_conn_id)
        except Exception as err:
            raise _connection_error(self.txn_log_conn_id, err) from None
        return make_url(_url(conn)).set(drivername="postgresql+psycopg")

    def log_url(self) -> str:
        """The URL as text, password included: for a job's environment, never for a log line."""
        url = self.sqlalchemy_url()
        return url if isinstance(url, str) else url.render_as_string(hide_password=False)

    def get_engine(self) -> Engine:
        """The engine of this connection's log, shared by every hook of the process."""
        if self._engine is None:
            url = self.log_url()
            engine = _ENGINES.get(url)
            if engine is None:
                engine = _ENGINES[url] = engine_from_url(url)
            self._engine = engine
        return self._engine

    def get_log(self, *, migrate: bool = True) -> TransactionLog:
        """The transaction log; applies the schema migrations first unless ``migrate=False``
        (checked once per process: see :func:`airflow_txn_provider.schema.ensure`)."""
        return TransactionLog(self.get_engine(), migrate=migrate)

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self.get_engine().connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except Exception as err:  # report, don't raise: this backs the UI's "Test" button
            return False, str(err)
        return True, "Connection successfully tested"


def _connection_error(conn_id: str, err: Exception) -> TxnConfigError:
    """A missing or unreadable connection, said so that a person knows what to set."""
    return TxnConfigError(
        f"the transaction log's Airflow connection {conn_id!r} is missing or unreadable "
        f"({type(err).__name__}: {err}). Create it (type txn_log: host, port, login, password, "
        f"database) in Admin > Connections, or set AIRFLOW_CONN_{conn_id.upper()}="
        "postgresql://user:password@host:5432/database"
    )


def _url(conn: Any) -> URL | str:
    """SQLAlchemy URL of a ``txn_log`` connection (``extra.sqlalchemy_url`` overrides the rest)."""
    extra = dict(conn.extra_dejson or {})
    if "sqlalchemy_url" in extra:
        return str(extra["sqlalchemy_url"])
    return URL.create(
        "postgresql+psycopg2",
        username=conn.login or None,
        password=conn.password or None,
        host=conn.host or "127.0.0.1",
        port=int(conn.port) if conn.port else 5432,
        database=conn.schema or "postgres",
        query={k: str(v) for k, v in extra.items()},
    )
