"""The failure-injection switch (failure_injection.py): which attempts of which txids it makes
fail, and a bad setting refused with its text."""

from __future__ import annotations

import pytest

from airflow_txn_provider.failure_injection import InjectedFailureRule as Rule
from airflow_txn_provider.failure_injection import (
    injected_failure,
    parse_failure_injection,
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("3", {3: Rule(1)}),
        ("3:2, 7:*", {3: Rule(2), 7: Rule(None)}),
        ("", {}),
        (" 4 ,", {4: Rule(1)}),
        ("3@8,6:*@0.5", {3: Rule(1, 8.0), 6: Rule(None, 0.5)}),
    ],
)
def test_parse_failure_injection(spec, expected):
    assert parse_failure_injection(spec) == expected


@pytest.mark.parametrize("spec", ["x", "3:y", "0", "3:0", "3:-1", "3@x", "3@-1"])
def test_bad_failure_injection_is_refused_with_its_text(spec):
    with pytest.raises(ValueError, match="failure injection"):
        parse_failure_injection(spec)


def test_injected_failure_by_attempt():
    assert injected_failure("3", 3, 1) == Rule(1) and injected_failure("3", 3, 2) is None
    assert injected_failure("3:2", 3, 2) and injected_failure("3:2", 3, 3) is None
    assert injected_failure("3:*@2", 3, 50) == Rule(None, 2.0)
    assert injected_failure("3:*", 4, 1) is None
    assert injected_failure(None, 3, 1) is None
