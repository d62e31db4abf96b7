"""Waiting out a database that is restarting: one retry policy for every call to the log.

A transition that hits a dropped connection (a failover, an upgrade, a crash) is retried on a
new one with random exponential backoff for a bounded time, each wait logged, in the shape of
Airflow's ``run_with_db_retries``. Safe because each transition is one database transaction,
idempotent or fenced should it commit and its answer be lost: ``begin`` resumes its attempt,
``commit`` of a committed txid is a no-op, ``fail`` of a failed attempt fails nothing more.
Every retry loop of the provider (the log's :func:`retrying`, the triggers' polls, the REST hook,
the Spark Connect runner's first session) takes its backoff from :class:`Backoff`, with its own
numbers: through :meth:`Backoff.retrying` (tenacity), or, with rules of its own between tries,
:meth:`Backoff.wait` and :meth:`Backoff.out_of_time`. Not ours: PySpark's client retries
(:func:`~airflow_txn_provider.spark.connect_sessions.bound_client_retries`) and Airflow's.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from tenacity import RetryCallState, Retrying, stop_after_delay

from airflow_txn_provider.utils import metrics

log = logging.getLogger(__name__)

DEFAULT_OUTAGE_TIMEOUT = 180.0
"""Seconds a call waits for the log's Postgres to come back before it gives up (three minutes:
a restart or a failover, not a lost database)."""

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "53300", "55P03", "57P01", "57P02", "57P03"})
"""Errors a retry on a new connection cures: class 08 (connection exceptions) and these:
serialization failure, deadlock, too many connections, lock not available, admin / crash
shutdown, cannot connect now (the server is starting or recovering)."""
PERMANENT_CLASSES = frozenset({"22", "23", "28", "42", "54"})
"""Error classes no retry cures: data exception (a value out of range), integrity violation,
invalid authorization, syntax error or access rule violation, program limit exceeded (an index
row too large)."""
PERMANENT_SQLSTATES = frozenset({"57014"})
"""Query cancelled (``statement_timeout``): the same statement would time out again."""
DISK_FULL = "53100"
"""Disk full: retried for at most :data:`DISK_FULL_RETRY` seconds (space may be freed), then
permanent."""
DISK_FULL_RETRY = 30.0

_PERMANENT_MESSAGES = (
    "password authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "no password supplied",
    "peer authentication failed",
    "ident authentication failed",
    "is not permitted to log in",
    "ssl",
    "certificate",
)
"""Connection errors without a SQLSTATE (libpq's own, before the server answered) that waiting
does not cure: reported at once."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Backoff:
    """Random exponential backoff within a deadline: the one shape of every wait between retries.

    Retry ``n`` (from 1) waits a random share, at least ``floor``, of ``first * 2 ** (n - 1)``
    capped at ``cap`` seconds: jittered, so that many waiters do not come back at once. A loop
    gives up once ``deadline`` seconds have passed, counted from where it says.
    """

    first: float
    cap: float
    deadline: float
    floor: float = 0.0
    """The lowest share of the grown wait drawn (0: anything from nothing up to it)."""

    def wait(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1: the first retry)."""
        grown = min(self.cap, self.first * 2.0 ** min(max(attempt - 1, 0), 64))
        return grown * random.uniform(self.floor, 1.0)

    def out_of_time(self, elapsed: float) -> bool:
        """Whether a loop that has been retrying for ``elapsed`` seconds gives up."""
        return elapsed >= self.deadline

    def __call__(self, state: RetryCallState) -> float:  # tenacity's ``wait``
        return self.wait(state.attempt_number)

    def retrying(self, **kwargs: Any) -> Retrying:
        """A tenacity ``Retrying`` with this wait and deadline; ``kwargs``: what to retry, what
        to log (``retry``, ``before_sleep``, ``reraise``, …)."""
        return Retrying(wait=self, stop=stop_after_delay(max(self.deadline, 0.0)), **kwargs)


def sqlstate(err: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg 3's ``sqlstate``, psycopg2's ``pgcode``), or
    ``None`` (no server answer, or not a database error)."""
    orig = getattr(err, "orig", err)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code) if code else None


_RETRIED_CONDITIONS = {
    "40001": "hit a serialization failure (concurrent transactions)",
    "40P01": "hit a deadlock (Postgres aborted one of two transactions)",
    "53300": "has too many connections",
    "55P03": "could not have a lock in time",
    "57P01": "is shutting down (an administrator's command)",
    "57P02": "is restarting after a crash",
    "57P03": "is starting up or recovering",
}
"""What a retried SQLSTATE says happened, as a log line names it."""


def retry_condition(err: BaseException | None) -> str:
    """What happened to a call that is retried, in words an on-call reader acts on: a deadlock or
    a serialization failure is a conflict between transactions (the database is fine), not an
    outage."""
    code = sqlstate(err) if err is not None else None
    if code == DISK_FULL:
        return "is out of disk space"
    if code is not None and code in _RETRIED_CONDITIONS:
        return _RETRIED_CONDITIONS[code]
    return "is unreachable"


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` says the database is unreachable or restarting (retry on a new connection),
    as opposed to a query or a value that is wrong (report it: waiting cures nothing).

    By SQLSTATE where the server gave one (:data:`TRANSIENT_SQLSTATES`, class 08 transient;
    :data:`PERMANENT_CLASSES`, :data:`PERMANENT_SQLSTATES` and disk full permanent, see
    :func:`retrying` for disk full's bounded retry); without one (libpq could not connect, or
    the connection dropped mid-statement), transient unless the message names a cause waiting
    does not cure (a wrong password, an SSL problem)."""
    if isinstance(err, DisconnectionError):
        return True
    if not isinstance(err, DBAPIError):
        return False
    code = sqlstate(err)
    if code is not None:
        return code.startswith("08") or code in TRANSIENT_SQLSTATES
    message = str(err.orig).lower()
    if any(text in message for text in _PERMANENT_MESSAGES):
        return False
    if err.connection_invalidated:
        return True
    # The server closed the connection, is starting up or shutting down, or refused it;
    # InterfaceError: the connection was already closed.
    return isinstance(err, (OperationalError, InterfaceError))


def is_permanent(err: BaseException) -> bool:
    """A database error no retry cures (see :func:`is_transient`): the txid it happened to fails
    at once, with the cascade and the poison policy, instead of waiting."""
    return isinstance(err, DBAPIError) and not is_transient(err)


def retrying(
    outage_timeout: float, what: str = "the transaction log", pipeline: str | None = None
) -> Retrying:
    """The retry policy: transient errors only, backoff 0.5 s to 10 s, at most ``outage_timeout``
    seconds in all (``0`` disables retries). ``pipeline``: whose work is retried (each retry
    counts in the metric ``txn.retries``, by the error's kind)."""

    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        if pipeline is not None:
            metrics.incr(metrics.RETRIES, pipeline, kind=type(err).__name__)
        first_line = str(err).strip().splitlines()[0] if err and str(err).strip() else ""
        log.warning(
            "%s %s (%s: %s); retry %s in %.1f s (%.0f of %.0f s waited)",
            what,
            retry_condition(err),
            type(err).__name__,
            first_line[:200],
            state.attempt_number,
            state.upcoming_sleep,
            state.seconds_since_start,
            outage_timeout,
        )

    def retry(state: RetryCallState) -> bool:
        err = state.outcome.exception() if state.outcome else None
        if err is None:
            return False
        if sqlstate(err) == DISK_FULL:  # space may be freed: a bounded wait, then permanent
            return (state.seconds_since_start or 0.0) < DISK_FULL_RETRY
        return is_transient(err)

    backoff = Backoff(first=0.5, cap=10.0, deadline=outage_timeout)
    return backoff.retrying(retry=retry, before_sleep=before_sleep, reraise=True)


def retry_transient(method: F) -> F:
    """Retry a method of an object with an ``outage_timeout`` attribute on transient DB errors."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # the log's methods take the pipeline first: its retries count in its metrics
        pipeline = args[0] if args and isinstance(args[0], str) else None
        for attempt in retrying(self.outage_timeout, pipeline=pipeline):
            with attempt:
                return method(self, *args, **kwargs)
        raise AssertionError("unreachable")  # Retrying reraises the last error

    return wrapper  # type: ignore[return-value]
