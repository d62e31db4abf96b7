"""The retry policy's classification of database errors by SQLSTATE (issue 25): what a retry
cures is retried, what it cannot is permanent, and every class is one or the other."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.exc import DataError, OperationalError, ProgrammingError

from airflow_txn_provider.utils.retries import (
    DISK_FULL,
    Backoff,
    is_permanent,
    is_transient,
    retry_condition,
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
    import airflow_txn_provider.utils.retries as retries

    saved = retries.DISK_FULL_RETRY
    retries.DISK_FULL_RETRY = 0.05
    try:
        with pytest.raises(OperationalError):
            policy(full)
    finally:
        retries.DISK_FULL_RETRY = saved
    assert len(calls) > 1  # retried, and then given up long before the outage timeout


# -- the one backoff shape of every retry loop (issue 28) --------------------------------------


def test_waits_grow_until_the_cap(monkeypatch):
    import airflow_txn_provider.utils.retries as retries

    monkeypatch.setattr(retries.random, "uniform", lambda low, high: high)  # the top of each draw
    backoff = Backoff(first=0.5, cap=10.0, deadline=60.0)
    assert [backoff.wait(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.wait(10_000) == 10.0  # no overflow however long the outage


@pytest.mark.parametrize("floor", [0.0, 0.5])
def test_waits_are_jittered_within_floor_and_grown_wait(floor):
    backoff = Backoff(first=1.0, cap=10.0, deadline=60.0, floor=floor)
    for n, grown in [(1, 1.0), (3, 4.0), (9, 10.0)]:
        waits = [backoff.wait(n) for _ in range(200)]
        assert all(floor * grown <= w <= grown for w in waits)
        assert len(set(waits)) > 100  # random, not one value


def test_the_deadline_stops():
    backoff = Backoff(first=1.0, cap=10.0, deadline=3.0)
    assert not backoff.out_of_time(2.99) and backoff.out_of_time(3.0)
    assert Backoff(first=1.0, cap=1.0, deadline=0.0).out_of_time(0.0)  # 0: no retry

    calls = []

    def down():
        calls.append(1)
        raise ConnectionError("down")

    policy = Backoff(first=0.001, cap=0.001, deadline=0.05).retrying(reraise=True)
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        policy(down)
    assert len(calls) > 1 and time.monotonic() - started < 5.0
    once = Backoff(first=0.001, cap=0.001, deadline=0.0).retrying(reraise=True)
    calls.clear()
    with pytest.raises(ConnectionError):
        once(down)
    assert calls == [1]


def test_tenacity_is_given_the_wait_of_each_attempt(monkeypatch):
    import airflow_txn_provider.utils.retries as retries

    monkeypatch.setattr(retries.random, "uniform", lambda low, high: high)
    waits: list[float] = []

    def back_at_the_fifth_try():
        if len(waits) < 4:
            raise ConnectionError("down")
        return "up"

    policy = Backoff(first=0.5, cap=10.0, deadline=60.0).retrying(sleep=waits.append)
    assert policy(back_at_the_fifth_try) == "up"
    assert waits == [0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("poll_interval", [0.01, 0.5, 1.0, 5.0])
def test_the_triggers_outage_waits_are_the_ones_it_always_had(monkeypatch, poll_interval):
    """Before issue 28: ``min(10, poll_interval * 2 ** min(failures, 4)) * uniform(0.5, 1)``."""
    import airflow_txn_provider.utils.retries as retries
    from airflow_txn_provider.triggers.txn_log import outage_backoff

    backoff = outage_backoff(poll_interval, 180.0)
    for draw in (0.5, 0.75, 1.0):
        monkeypatch.setattr(retries.random, "uniform", lambda low, high, d=draw: d)
        for failures in range(1, 9):
            old = min(10.0, poll_interval * 2 ** min(failures, 4)) * draw
            assert backoff.wait(failures) == pytest.approx(old)
    assert backoff.floor == 0.5 and backoff.deadline == 180.0


def test_the_rest_hooks_waits_are_the_ones_it_always_had(monkeypatch):
    """Before issue 28: ``min(2.0 ** attempt, 10.0) * uniform(0.5, 1)``, attempt from 0."""
    import airflow_txn_provider.utils.retries as retries
    from airflow_txn_provider.hooks.airflow_api import AirflowApiHook

    backoff = AirflowApiHook(outage_timeout=42.0).backoff()
    for draw in (0.5, 1.0):
        monkeypatch.setattr(retries.random, "uniform", lambda low, high, d=draw: d)
        for attempt in range(8):
            assert backoff.wait(attempt + 1) == min(2.0**attempt, 10.0) * draw
    assert backoff.floor == 0.5 and backoff.deadline == 42.0


# -- what a retry's log line says happened (issue 46) ------------------------------------------


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("40P01", "hit a deadlock"),
        ("40001", "hit a serialization failure"),
        ("55P03", "could not have a lock in time"),
        ("57P01", "is shutting down"),
        ("08006", "is unreachable"),
        (None, "is unreachable"),
    ],
)
def test_a_retry_names_what_happened_not_always_an_outage(code, said, caplog):
    tries = []

    def flaky():
        tries.append(1)
        if len(tries) == 1:
            raise _err(code)
        return "done"

    policy = retrying(outage_timeout=600)
    policy.wait = lambda state: 0.0
    with caplog.at_level("WARNING", logger="airflow_txn_provider.utils.retries"):
        assert policy(flaky) == "done"
    (line,) = [r.getMessage() for r in caplog.records if "retry 1" in r.getMessage()]
    assert line.startswith(f"the transaction log {said} ("), line
    assert retry_condition(_err(code)) == said or retry_condition(_err(code)).startswith(said)
