"""Airflow hook: the transaction log (and its SQLAlchemy engine) from an Airflow connection."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow.providers.postgres.hooks.postgres import PostgresHook

from airflow_txn_provider.rules.exceptions import TxnConfigError
from airflow_txn_provider.transactions.transaction_log import TransactionLog, engine_from_url
from airflow_txn_provider.utils.credentials import (
    DEFAULT_DATABASE,
    DEFAULT_HOST,
    DEFAULT_PORT,
    SYNC_DRIVER,
    postgres_url,
)

if TYPE_CHECKING:
    from airflow.sdk import Connection
    from sqlalchemy.engine import URL, Engine

ASYNC_DRIVER = SYNC_DRIVER
"""psycopg 3 serves the triggers' async engines too (SQLAlchemy picks its async mode)."""

_ENGINES: dict[str, Engine] = {}
"""One engine (and connection pool) per log URL and process: a task opens the log several times
(claim, lease renewals, staging, commit): its hooks share one instead of each building its own."""
# A forked child must not share the parent's pooled connections: it starts with no engine.
os.register_at_fork(after_in_child=_ENGINES.clear)


class TxnLogHook(PostgresHook):
    """Opens the Postgres transaction log described by an Airflow connection.

    A :class:`~airflow.providers.postgres.hooks.postgres.PostgresHook` on its own connection type
    (``txn_log``): host, port, login, password and, in *schema*, the database name, with the
    defaults ``127.0.0.1``, ``5432`` and ``postgres``. Extra keys are passed as libpq parameters
    (e.g. ``{"sslmode": "require"}``), except the options PostgresHook reserves for itself
    (``iam``, ``cursor``, ``sqlalchemy_query``, …: see ``PostgresHook.ignored_extra_options``);
    ``{"sqlalchemy_url": "..."}`` in extra overrides everything else.

    The log is reached through :meth:`get_log` / :meth:`get_engine`: one engine per URL and
    process, with the psycopg (3) driver. PostgresHook's own DB-API methods (``get_conn``, ``run``,
    ``get_records``, …) are inherited as they are: they connect from the connection's fields with
    psycopg 3, and ignore ``extra.sqlalchemy_url``.

    :param txn_log_conn_id: the Airflow connection id (default ``txn_log_default``).
    :param sqlalchemy_scheme: the SQLAlchemy driver of :attr:`sqlalchemy_url` (default
        ``postgresql+psycopg``; a ``postgresql+psycopg2`` URL names the same database).
    """

    conn_name_attr = "txn_log_conn_id"
    default_conn_name = "txn_log_default"
    conn_type = "txn_log"
    hook_name = "Transaction log (Postgres)"
    ignored_extra_options = PostgresHook.ignored_extra_options | {"sqlalchemy_url"}

    def __init__(
        self,
        txn_log_conn_id: str = default_conn_name,
        *,
        sqlalchemy_scheme: str = SYNC_DRIVER,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            txn_log_conn_id=txn_log_conn_id, sqlalchemy_scheme=sqlalchemy_scheme, **kwargs
        )
        self.txn_log_conn_id = txn_log_conn_id
        self._engine: Engine | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database"},
            "placeholders": {
                "host": DEFAULT_HOST,
                "port": str(DEFAULT_PORT),
                "schema": DEFAULT_DATABASE,
                "extra": '{"sslmode": "prefer"}',
            },
        }

    def _log_connection(self) -> Connection:
        """The Airflow connection (read once per hook); a missing or unreadable one is a
        :class:`~airflow_txn_provider.rules.exceptions.TxnConfigError` that says what to set."""
        try:
            return self.connection
        except Exception as err:
            raise _connection_error(self.txn_log_conn_id, err) from None

    @property
    def sqlalchemy_url(self) -> URL:
        """``extra.sqlalchemy_url`` if set, else PostgresHook's URL of the connection with this
        hook's defaults (host, port, database) and the extra keys as libpq parameters
        (:func:`~airflow_txn_provider.utils.credentials.postgres_url`)."""
        return postgres_url(
            self.txn_log_conn_id, connection=self._log_connection(), scheme=self.sqlalchemy_scheme
        )

    def get_uri(self) -> str:
        """:attr:`sqlalchemy_url` as text, password included."""
        return self.sqlalchemy_url.render_as_string(hide_password=False)

    async def async_sqlalchemy_url(self) -> URL:
        """The URL with psycopg 3's async driver, for triggers (connection looked up async)."""
        try:
            conn = await self.aget_connection(self.txn_log_conn_id)
        except Exception as err:
            raise _connection_error(self.txn_log_conn_id, err) from None
        # The same URL as the sync path, from the connection already read: no sync lookup here
        hook = TxnLogHook(self.txn_log_conn_id, connection=conn)
        return hook.sqlalchemy_url.set(drivername=ASYNC_DRIVER)

    def log_url(self) -> str:
        """The URL as text, password included: for a job's environment, never for a log line."""
        return self.get_uri()

    def get_engine(self) -> Engine:
        """The engine of this connection's log, shared by every hook of the process."""
        if self._engine is None:
            url = self.log_url()
            engine = _ENGINES.get(url)
            if engine is None:
                engine = _ENGINES[url] = engine_from_url(url)
            self._engine = engine
        return self._engine

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Engine:
        """The shared engine of :meth:`get_engine`; a new one only for given ``engine_kwargs``."""
        if not engine_kwargs:
            return self.get_engine()
        return engine_from_url(self.log_url(), **engine_kwargs)

    def get_log(self, *, migrate: bool = True) -> TransactionLog:
        """The transaction log; applies the schema migrations first unless ``migrate=False``
        (checked once per process: see :func:`airflow_txn_provider.log.schema.ensure`)."""
        return TransactionLog(self.get_engine(), migrate=migrate)

    # [override]: common-sql's stub types DbApiHook.test_connection as returning None
    def test_connection(self) -> tuple[bool, str]:  # type: ignore[override]
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
