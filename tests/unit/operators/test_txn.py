"""Operator-layer rules that need no services: telling an Airflow retry from a first try, and
how long the run ahead's claim waits in its worker."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from airflow_txn_provider.operators import txn
from airflow_txn_provider.operators.txn import is_airflow_retry
from tests.unit.builders import FAIL, PROC, view


@pytest.mark.parametrize(
    ("try_number", "max_tries", "retries", "expected"),
    [
        (1, 12, 12, False),  # the run's first try
        (2, 12, 12, True),  # Airflow retrying it
        (13, 12, 12, True),  # its last retry
        (3, 14, 12, False),  # cleared after try 2: max_tries = 2 + retries
        (4, 14, 12, True),  # and retried after that
        (1, 0, 0, False),  # a task without retries
        (2, 1, 0, False),  # ... cleared once
    ],
)
def test_is_airflow_retry(try_number, max_tries, retries, expected):
    ti = SimpleNamespace(try_number=try_number, max_tries=max_tries)
    assert is_airflow_retry(ti, retries) is expected


class Log:
    """The log as the claim's wait reads it: one view per look, the last one repeated."""

    def __init__(self, *views):
        self.views, self.looks = list(views), 0

    def view(self, pipeline):
        assert pipeline == "p"
        self.looks += 1
        return self.views[min(self.looks, len(self.views)) - 1]


FULL = view((4, 1, PROC), (5, 1, PROC), last=3, max_pending=2)
MOVED = view((5, 1, PROC), last=4, max_pending=2)  # txid 4 committed: 6 may begin
FAILED = view((4, 2, FAIL), (5, 1, FAIL), last=3, max_pending=2)  # the cascade: 4 replays first


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(txn, "AHEAD_POLL", 0.001)


def test_the_run_ahead_begins_once_the_oldest_txid_commits(fast):
    log = Log(FULL, FULL, FULL, MOVED)
    assert txn.window_moved(log, "p", 6, time.monotonic() + 5)
    assert log.looks == 4


def test_the_run_ahead_stops_waiting_when_a_txid_before_it_fails(fast):
    log = Log(FULL, FULL, FAILED)
    assert not txn.window_moved(log, "p", 6, time.monotonic() + 5)
    assert log.looks == 3  # it defers: its wait may be long now


def test_a_txid_further_than_one_past_the_window_does_not_wait_in_its_worker(fast):
    log = Log(FULL)
    assert not txn.window_moved(log, "p", 7, time.monotonic() + 5)
    assert log.looks == 1


def test_the_run_ahead_waits_no_longer_than_its_deadline(fast):
    log = Log(FULL)
    started = time.monotonic()
    assert not txn.window_moved(log, "p", 6, started + 0.05)
    assert 0.05 <= time.monotonic() - started < 2 and log.looks > 2
