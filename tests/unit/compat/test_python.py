"""compat/python.py: the Python version differences behave alike on every version (`make
test-matrix` runs this on each cell: Python 3.10 and 3.13, Airflow 3.1 and 3.3, PySpark 3.5 and
4.3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from airflow_txn_provider.compat.python import UTC, StrEnum, fromisoformat


class Color(StrEnum):
    RED = "red"


def test_a_str_enum_member_is_its_value_as_a_string():
    assert Color.RED == "red" and isinstance(Color.RED, str)
    assert str(Color.RED) == f"{Color.RED}" == "red"
    assert Color("red") is Color.RED


def test_utc_is_the_zero_offset():
    assert datetime(2026, 1, 1, tzinfo=UTC).utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text", ["2000-01-01T00:00:00Z", "2000-01-01T00:00:00.123456Z", "2000-01-01T00:00:00+00:00"]
)
def test_an_iso_time_with_a_z_reads_as_utc_on_every_python(text):
    # Airflow's REST API writes "Z"; Python 3.10's datetime.fromisoformat refuses it
    when = fromisoformat(text)
    assert when.utcoffset() == timedelta(0) and when.replace(microsecond=0) == datetime(
        2000, 1, 1, tzinfo=UTC
    )


def test_a_bad_iso_time_is_still_refused():
    with pytest.raises(ValueError):
        fromisoformat("2000-13-01T00:00:00Z")
