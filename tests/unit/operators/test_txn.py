"""Operator-layer rules that need no services: telling an Airflow retry from a first try."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_txn_provider.operators.txn import is_airflow_retry


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
