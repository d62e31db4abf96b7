"""Redaction: passwords and looked-up secrets kept out of every text that is stored or shown.

:func:`redact` is applied to every error text the log stores (``last_error``), the run notes and
the Transactions page: a URL's password, and any secret this process looked up
(:func:`register_secret`, called by :mod:`~airflow_txn_provider.utils.credentials`), become ``***``,
and so does whatever Airflow's secrets masker knows, where Airflow is loaded.

Imports nothing of the package and Airflow only where it is loaded already: the core modules (the
log, the Spark job) import this one.
"""

from __future__ import annotations

import logging
import re
import sys
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


__all__ = ["REPLACEMENT", "RedactingFilter", "redact", "redact_optional", "register_secret"]
