"""Credentials: looked up from Airflow connections where they are used, and kept out of every
text that is stored or shown.

* A source or sink names an Airflow connection (``catalog_conn_id``), never a URL with a
  password: its spec travels in ``spark-submit``'s arguments, which ``ps`` and the task log's
  "Spark-Submit cmd" line show. :func:`connection_url` looks the connection up where it is used
  (Airflow's lookup: ``AIRFLOW_CONN_<ID>`` in the environment, then the deployment's secrets
  backend); :func:`connection_env` hands its URL to a ``spark-submit`` driver through that
  process's environment, readable by its own user alone.
* :func:`redact` is applied to every error text the log stores (``last_error``), the run notes
  and the Transactions page: a URL's password, and any secret this process looked up, become
  ``***``, and so does whatever Airflow's secrets masker knows, where Airflow is loaded.

Airflow is imported lazily here: the core modules (the log, the Spark job) import this one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

REPLACEMENT = "***"
# scheme://user:password@ — the password part, in any URL-shaped text (SQLAlchemy, libpq, JDBC).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@]*:)[^\s@/]+@")
# password=... in a libpq keyword string or a query string
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('[^']*'|[^\s&;]+)", re.IGNORECASE)
_MIN_SECRET_LENGTH = 4
"""Shorter secrets are not replaced in texts (they would blank out ordinary words)."""

_secrets: set[str] = set()
"""Secrets this process looked up (:func:`register_secret`)."""
# Airflow's maskers, where loaded: the task SDK's (workers, triggerer) and the core's (api-server).
_AIRFLOW_MASKERS = ("airflow.sdk._shared.secrets_masker", "airflow._shared.secrets_masker")


def register_secret(secret: str | None) -> None:
    """Never show ``secret``: in this module's :func:`redact`, and in Airflow's secrets masker
    when this process runs Airflow (task logs, and the supervisor's, are masked by it)."""
    if not secret or len(secret) < _MIN_SECRET_LENGTH:
        return
    _secrets.add(secret)
    if "airflow.sdk.log" in sys.modules:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)


def redact(text: Any) -> str:
    """``text`` (made a string) with URL passwords, ``password=`` values and every registered
    secret replaced by ``***``."""
    out = _URL_PASSWORD.sub(rf"\1{REPLACEMENT}@", str(text))
    out = _KEYWORD_PASSWORD.sub(rf"\1{REPLACEMENT}", out)
    for secret in sorted(_secrets, key=len, reverse=True):
        out = out.replace(secret, REPLACEMENT)
    for name in _AIRFLOW_MASKERS:
        masker = sys.modules.get(name)
        if masker is not None:
            out = str(masker.redact(out))
    return out


class RedactingFilter(logging.Filter):
    r"""A logging filter that :func:`redact`\ s each record's message: for processes whose log
    lines Airflow's masker does not see first (a ``spark-submit`` driver's output is echoed by
    the LocalExecutor's supervisor to its own stdout unmasked)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def redact_optional(text: str | None) -> str | None:
    return None if text is None else redact(text)


def connection_url(conn_id: str, *, what: str = "a Postgres database") -> str:
    """The SQLAlchemy URL (psycopg 3) of the Postgres Airflow connection ``conn_id``; its password
    is registered secret.

    In a process that runs Airflow, Airflow's lookup finds it (``AIRFLOW_CONN_<ID>`` in the
    environment, then the secrets backend or the metastore). A ``spark-submit`` driver cannot
    import Airflow (a task's children inherit a metadata-database URL Airflow refuses), so its
    task hands it the URL in :func:`connection_env`'s variable, which is read first.
    A missing connection is a :class:`~airflow_txn_provider.exceptions.TxnConfigError`."""
    handed = os.environ.get(handed_url_var(conn_id))
    if handed:
        url = handed
    else:
        url = _looked_up_url(conn_id, what)
    from sqlalchemy.engine import make_url

    register_secret(make_url(url).password)
    return url


def _looked_up_url(conn_id: str, what: str) -> str:
    from airflow_txn_provider.exceptions import TxnConfigError
    from airflow_txn_provider.hooks.txn_log import TxnLogHook

    try:
        return TxnLogHook(conn_id).sqlalchemy_url.render_as_string(hide_password=False)
    except TxnConfigError:
        raise TxnConfigError(
            f"the Airflow connection {conn_id!r} ({what}) is missing or unreadable: create it "
            f"(a Postgres database) in Admin > Connections or a secrets backend, or set "
            f"AIRFLOW_CONN_{conn_id.upper()}=postgresql://user:password@host:5432/database"
        ) from None


def handed_url_var(conn_id: str) -> str:
    """The environment variable through which a task hands connection ``conn_id``'s URL to its
    ``spark-submit`` driver."""
    return f"TXN_CONN_URL__{conn_id.upper()}"


def connection_env(conn_ids: Iterable[str]) -> dict[str, str]:
    """The URL of each connection, looked up here by Airflow, for a ``spark-submit`` driver's
    environment (readable by its own user alone), never its arguments."""
    return {handed_url_var(c): connection_url(c) for c in dict.fromkeys(conn_ids)}


__all__ = [
    "RedactingFilter",
    "connection_env",
    "connection_url",
    "handed_url_var",
    "redact",
    "redact_optional",
    "register_secret",
]
