"""The window that fits a Spark: two txids in flight per core it offers, within bounds."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.config import (
    FIRST_WINDOW,
    FITTED_WINDOW_BOUND,
    fitted_window,
    spark_work_slots,
    validate_max_pending,
)


@pytest.mark.parametrize(
    ("cores", "window"),
    [(1, 2), (2, 3), (3, 4), (15, 16), (16, 16), (64, FITTED_WINDOW_BOUND), (0, 1), (-3, 1)],
)
def test_one_txid_in_flight_per_core_and_one_beside_within_the_bound(cores, window):
    assert fitted_window(cores) == window


def test_the_bound_is_a_parameter():
    assert fitted_window(64, bound=4) == 4
    assert fitted_window(1, bound=4) == 2


@pytest.mark.parametrize("cores", [None, 2.0, "2", True])
def test_cores_must_be_an_int(cores):
    with pytest.raises(TypeError, match="spark_cores"):
        fitted_window(cores)


def test_the_first_window_is_within_the_bound():
    assert 1 <= FIRST_WINDOW <= FITTED_WINDOW_BOUND


def test_max_pending_is_a_positive_int_or_none():
    assert validate_max_pending(None) is None
    assert validate_max_pending(3) == 3
    for bad in (0, -1, 2.5, "4", True):
        with pytest.raises(ValueError, match="max_pending"):
            validate_max_pending(bad)


@pytest.mark.parametrize("cores", [1, 2, 3, 15, 64])
def test_a_fitted_window_computes_one_txid_per_core_and_starts_the_one_beside(cores):
    assert spark_work_slots(fitted_window(cores)) == min(cores, FITTED_WINDOW_BOUND - 1)
    assert spark_work_slots(1) == 1  # never none
