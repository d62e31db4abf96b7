"""The retry policy's classification of database errors by SQLSTATE (issue 25): what a retry
cures is retried, what it cannot is permanent, and every class is one or the other."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DataError, OperationalError, ProgrammingError

from airflow_txn_provider.retries import (
    DISK_FULL,
    is_permanent,
    is_transient,
    retrying,
)


class _Orig(Exception):
    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(message)
        self.sqlstate = code


def _err(code: str | None, message: str = "boom", kind: type = OperationalError):
    return kind("SELECT 1", {}, _Orig(message, code))


TRANSIENT = [
    "08000",
    "08003",
    "08006",
    "08001",
    "08004",
    "40001",
    "40P01",
    "53300",
    "55P03",
    "57P01",
    "57P02",
    "57P03",
]
PERMANENT = [
    "22003",
    "22012",
    "22P02",
    "23505",
    "23502",
    "28000",
    "28P01",
    "42601",
    "42P01",
    "54000",
    "54001",
    "57014",
    DISK_FULL,
]


@pytest.mark.parametrize("code", TRANSIENT)
def test_connection_loss_deadlocks_and_restarts_are_retried(code):
    assert is_transient(_err(code)) and not is_permanent(_err(code))


@pytest.mark.parametrize("code", PERMANENT)
def test_data_integrity_auth_syntax_limits_and_timeouts_are_permanent(code):
    # ProgramLimitExceeded (54000) and a statement timeout are OperationalError subclasses:
    # the class is not what decides, the SQLSTATE is.
    assert not is_transient(_err(code)) and is_permanent(_err(code))
    assert not is_transient(_err(code, kind=DataError))
    assert not is_transient(_err(code, kind=ProgrammingError))


@pytest.mark.parametrize(
    "message",
    [
        'FATAL:  password authentication failed for user "txn"',
        "fe_sendauth: no password supplied",
        'FATAL:  Peer authentication failed for user "txn"',
        'FATAL:  Ident authentication failed for user "txn"',
        'FATAL:  role "txn" is not permitted to log in',
        "SSL error: certificate verify failed",
        'FATAL:  database "txn" does not exist',
    ],
)
def test_connection_errors_waiting_does_not_cure_are_permanent_without_a_sqlstate(message):
    assert not is_transient(_err(None, message))


def test_a_dropped_connection_without_a_sqlstate_is_transient():
    assert is_transient(_err(None, "server closed the connection unexpectedly"))
    assert is_transient(_err(None, "connection refused"))


def test_disk_full_is_retried_for_a_bounded_time_then_raised():
    calls = []

    def full():
        calls.append(1)
        raise _err(DISK_FULL)

    policy = retrying(outage_timeout=600)
    policy.wait = lambda state: 0.0  # no sleeping in a unit test
    import airflow_txn_provider.retries as retries

    saved = retries.DISK_FULL_RETRY
    retries.DISK_FULL_RETRY = 0.05
    try:
        with pytest.raises(OperationalError):
            policy(full)
    finally:
        retries.DISK_FULL_RETRY = saved
    assert len(calls) > 1  # retried, and then given up long before the outage timeout
