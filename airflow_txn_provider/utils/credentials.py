"""Credentials: looked up from Airflow connections where they are used, never written down.

A source or sink names an Airflow connection (``catalog_conn_id``), never a URL with a password:
its spec travels in ``spark-submit``'s arguments, which ``ps`` and the task log's "Spark-Submit
cmd" line show. :func:`connection_url` looks the connection up where it is used (Airflow's
lookup: ``AIRFLOW_CONN_<ID>`` in the environment, then the deployment's secrets backend) and
registers its password with :mod:`~airflow_txn_provider.utils.redaction`; :func:`connection_env`
hands its URL to a ``spark-submit`` driver through that process's environment, readable by its own
user alone.

Airflow is imported lazily here: the Iceberg sink imports this module in a Spark driver too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.rules.exceptions import TxnConfigError
from airflow_txn_provider.utils.redaction import register_secret

if TYPE_CHECKING:
    from airflow.sdk import Connection
    from sqlalchemy.engine import URL

LOG_DRIVER = "psycopg"
"""The log's driver: psycopg 3, whose binary ``COPY`` stages partial results (no text round trip:
every key is stored as it is, a carriage return included); PostgresHook's default too."""
SYNC_DRIVER = f"postgresql+{LOG_DRIVER}"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5432
DEFAULT_DATABASE = "postgres"


def connection_url(conn_id: str, *, what: str = "a Postgres database") -> str:
    """The SQLAlchemy URL (psycopg 3) of the Postgres Airflow connection ``conn_id``; its password
    is registered secret.

    In a process that runs Airflow, Airflow's lookup finds it (``AIRFLOW_CONN_<ID>`` in the
    environment, then the secrets backend or the metastore). A ``spark-submit`` driver cannot
    import Airflow (a task's children inherit a metadata-database URL Airflow refuses), so its
    task hands it the URL in :func:`connection_env`'s variable, which is read first.
    A missing connection is a :class:`~airflow_txn_provider.rules.exceptions.TxnConfigError`."""
    handed = os.environ.get(handed_url_var(conn_id))
    if handed:
        url = handed
    else:
        url = _looked_up_url(conn_id, what)
    from sqlalchemy.engine import make_url

    register_secret(make_url(url).password)
    return url


def _looked_up_url(conn_id: str, what: str) -> str:
    try:
        return postgres_url(conn_id).render_as_string(hide_password=False)
    except Exception as err:  # its text may quote the URL: the type alone says which way it failed
        raise TxnConfigError(
            f"the Airflow connection {conn_id!r} ({what}) is missing or unreadable "
            f"({type(err).__name__}): create it "
            f"(a Postgres database) in Admin > Connections or a secrets backend, or set "
            f"AIRFLOW_CONN_{conn_id.upper()}=postgresql://user:password@host:5432/database"
        ) from None


def postgres_url(
    conn_id: str, *, connection: Connection | None = None, scheme: str = SYNC_DRIVER
) -> URL:
    """The SQLAlchemy URL of the Postgres Airflow connection ``conn_id`` (or of ``connection``,
    already read): ``extra.sqlalchemy_url`` if set, else PostgresHook's URL of it with the
    defaults ``DEFAULT_HOST``, ``DEFAULT_PORT`` and ``DEFAULT_DATABASE``, and the extra keys as
    libpq parameters (those PostgresHook reserves for itself left out). The log's hook and every
    other Postgres connection (an Iceberg catalog) are read by this one rule."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from sqlalchemy.engine import make_url

    hook = PostgresHook(postgres_conn_id=conn_id, connection=connection, sqlalchemy_scheme=scheme)
    extra = hook.connection.extra_dejson or {}
    if "sqlalchemy_url" in extra:
        return make_url(str(extra["sqlalchemy_url"]))
    url = hook.sqlalchemy_url
    ignored = PostgresHook.ignored_extra_options | {"sqlalchemy_url"}  # not libpq parameters
    libpq = {k: str(v) for k, v in extra.items() if k not in ignored}
    return url.set(
        username=url.username or None,
        password=url.password or None,
        host=url.host or DEFAULT_HOST,
        port=url.port or DEFAULT_PORT,
        database=url.database or DEFAULT_DATABASE,
    ).update_query_dict(libpq)


def handed_url_var(conn_id: str) -> str:
    """The environment variable through which a task hands connection ``conn_id``'s URL to its
    ``spark-submit`` driver."""
    return f"TXN_CONN_URL__{conn_id.upper()}"


def connection_env(conn_ids: Iterable[str]) -> dict[str, str]:
    """The URL of each connection, looked up here by Airflow, for a ``spark-submit`` driver's
    environment (readable by its own user alone), never its arguments."""
    return {handed_url_var(c): connection_url(c) for c in dict.fromkeys(conn_ids)}


_SECRET_KEY = re.compile(r"password|secret|token|key$", re.IGNORECASE)
"""Kafka client settings whose values are secrets (``sasl.password``, ``ssl.key.password``,
``sasl.oauthbearer.client.secret``, …): registered, so that no text shows them."""


def kafka_config(conn_id: str) -> dict[str, Any]:
    """The Kafka client settings (librdkafka's, e.g. ``bootstrap.servers``, ``sasl.username``) of
    the Airflow connection ``conn_id``, of type ``kafka`` as the Apache Kafka provider defines it
    (its "Config Dict" is the connection's extra; the provider itself is optional). Its secret
    values are registered.

    As with :func:`connection_url`, a ``spark-submit`` driver reads the settings its task handed
    it (:func:`kafka_connection_env`); elsewhere Airflow's lookup finds the connection. A missing
    connection, or one without ``bootstrap.servers``, is a
    :class:`~airflow_txn_provider.rules.exceptions.TxnConfigError`."""
    handed = os.environ.get(handed_kafka_var(conn_id))
    config = json.loads(handed) if handed else _looked_up_kafka_config(conn_id)
    for key, value in config.items():
        if isinstance(value, str) and _SECRET_KEY.search(key):
            register_secret(value)
    return config


def _looked_up_kafka_config(conn_id: str) -> dict[str, Any]:
    try:
        from airflow.sdk import BaseHook

        # The Kafka provider's connection type keeps the settings in the extra: read as it does
        config = dict(BaseHook.get_connection(conn_id).extra_dejson)
    except Exception as err:  # AirflowNotFoundException, an unreadable extra
        raise TxnConfigError(
            f"the Airflow connection {conn_id!r} (a Kafka cluster) is missing or unreadable "
            f"({type(err).__name__}): create it, of type kafka, with its Config Dict (e.g. "
            '{"bootstrap.servers": "broker:9092"}) in Admin > Connections or a secrets backend'
        ) from None
    if not config.get("bootstrap.servers"):
        raise TxnConfigError(
            f"the Airflow connection {conn_id!r} (a Kafka cluster) has no bootstrap.servers in "
            "its Config Dict"
        )
    return config


def handed_kafka_var(conn_id: str) -> str:
    """The environment variable through which a task hands Kafka connection ``conn_id``'s
    settings (JSON) to its ``spark-submit`` driver."""
    return f"TXN_CONN_KAFKA__{conn_id.upper()}"


def kafka_connection_env(conn_ids: Iterable[str]) -> dict[str, str]:
    """The settings of each Kafka connection, for a ``spark-submit`` driver's environment."""
    return {handed_kafka_var(c): json.dumps(kafka_config(c)) for c in dict.fromkeys(conn_ids)}


__all__ = [
    "connection_env",
    "connection_url",
    "handed_kafka_var",
    "handed_url_var",
    "kafka_config",
    "kafka_connection_env",
]
