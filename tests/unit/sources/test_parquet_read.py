"""Which batch files Spark's partition discovery reads back as exactly their partition value."""

from __future__ import annotations

import pytest

from airflow_txn_provider.sources.parquet_read import _reads_back

BASE = "/data/ds"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("01", f"{BASE}/p=01/part-0.parquet"),
        ("1.50", f"{BASE}/p=1.50/part-0.parquet"),
        ("a b", f"{BASE}/p=a b/part-0.parquet"),
        ("x#y", f"{BASE}/p=x#y/sub/part-0.parquet"),  # a plain folder below: no column of its own
    ],
)
def test_plain_values_are_read_back(value, path):
    assert _reads_back(BASE, "p", value, path)


@pytest.mark.parametrize(
    ("value", "path", "why"),
    [
        ("5%", f"{BASE}/p=5%/part-0.parquet", "Spark decodes % escapes"),
        ("a%20b", f"{BASE}/p=a%20b/part-0.parquet", "Spark decodes % escapes"),
        ("", f"{BASE}/p=/part-0.parquet", "Spark refuses an empty value"),
        ("__HIVE_DEFAULT_PARTITION__", f"{BASE}/p=__HIVE_DEFAULT_PARTITION__/f.parquet", "null"),
        ("01", f"{BASE}/p=01/q=2/part-0.parquet", "a k=v folder adds a column"),
        ("01", f"{BASE}/p=1/part-0.parquet", "another partition's folder"),
        ("01", f"{BASE}/p=01", "the folder itself (files not listed)"),
        ("01", "/elsewhere/p=01/part-0.parquet", "outside the dataset"),
    ],
)
def test_values_spark_would_read_otherwise_are_not(value, path, why):
    assert not _reads_back(BASE, "p", value, path), why
