"""Waiting out a database that is restarting: one retry policy for every call to the log.

The transaction log's Postgres may restart (a failover, an upgrade, a crash) for seconds to a
minute. A transition that hits a dropped connection is retried on a new one with random
exponential backoff, for a bounded time, each wait logged; only then does the error reach the
caller. Retrying is safe because every transition is one database transaction that either
committed or did not, and each is idempotent or fenced when it did commit but its answer was lost:
``begin`` resumes the attempt it claimed, ``commit`` of a committed txid is a no-op, ``fail`` of a
failed attempt fails nothing more, a repeated ``stage_output`` is a duplicate.

This is the shape of Airflow's own ``run_with_db_retries`` (``airflow/utils/retries.py``):
tenacity, random exponential backoff, ``reraise=True``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

log = logging.getLogger(__name__)

DEFAULT_OUTAGE_TIMEOUT = 180.0
"""Seconds a call waits for the log's Postgres to come back before it gives up (three minutes:
a restart or a failover, not a lost database)."""

_PERMANENT = (
    "password authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
)
"""Connection errors that waiting does not cure: reported at once."""

F = TypeVar("F", bound=Callable[..., Any])


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` says the database is unreachable or restarting (retry on a new connection),
    as opposed to a query that is wrong (report it)."""
    if isinstance(err, DisconnectionError):
        return True
    if not isinstance(err, DBAPIError):
        return False
    if any(text in str(err.orig) for text in _PERMANENT):
        return False
    if err.connection_invalidated:
        return True
    # OperationalError: the server closed the connection, is starting up or shutting down, or
    # refused it; also a deadlock or serialization failure, which a retry resolves as well.
    # InterfaceError: the connection was already closed.
    return isinstance(err, (OperationalError, InterfaceError))


def retrying(outage_timeout: float, what: str = "the transaction log") -> Retrying:
    """The retry policy: transient errors only, backoff 0.5 s to 10 s, at most ``outage_timeout``
    seconds in all (``0`` disables retries)."""

    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        first_line = str(err).strip().splitlines()[0] if err and str(err).strip() else ""
        log.warning(
            "%s is unreachable (%s: %s); retry %s in %.1f s (%.0f of %.0f s waited)",
            what,
            type(err).__name__,
            first_line[:200],
            state.attempt_number,
            state.upcoming_sleep,
            state.seconds_since_start,
            outage_timeout,
        )

    return Retrying(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=0.5, max=10),
        stop=stop_after_delay(max(outage_timeout, 0.0)),
        before_sleep=before_sleep,
        reraise=True,
    )


def retry_transient(method: F) -> F:
    """Retry a method of an object with an ``outage_timeout`` attribute on transient DB errors."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        for attempt in retrying(self.outage_timeout):
            with attempt:
                return method(self, *args, **kwargs)
        raise AssertionError("unreachable")  # Retrying reraises the last error

    return wrapper  # type: ignore[return-value]
