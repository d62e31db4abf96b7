"""The source interface (:mod:`airflow_txn_provider.sources.base`): a source's spec rebuilt in
a job, its defaults, and the local path of a file Spark names."""

from __future__ import annotations

import json

import pytest

from airflow_txn_provider.sources.base import SparkSource, local_path, source_from_spec
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource


def test_source_spec_round_trip_and_errors(tmp_path):
    for source in (
        PartitionedParquetSource(str(tmp_path), 7, required_columns=("line",)),
        LandingDirectorySource(str(tmp_path), "line STRING, n INT", 3),
    ):
        assert source_from_spec(json.dumps(source.to_spec())) == source
    with pytest.raises(ValueError, match="cannot load source"):
        source_from_spec({"class": "nowhere:Nothing"})
    with pytest.raises(ValueError, match="not a SparkSource"):
        source_from_spec({"class": "pathlib:Path", "args": {}})


def test_the_defaults_say_nothing_more_than_the_batch():
    source = GeneratedTextSource(lines_per_second=3.0)
    assert isinstance(source, SparkSource)
    batch = object()  # the defaults never look at the frame
    assert source.records(batch) is batch  # type: ignore[arg-type]
    assert SparkSource.malformed_records(source, batch) is None  # type: ignore[arg-type]
    assert SparkSource.batch_counts(source, {}) is None
    assert SparkSource.batch_mismatch(source, batch, {}) is None  # type: ignore[arg-type]
    assert SparkSource.driver_env(source) == {}
    assert source.describe_location("f.json", "{") == "f.json"


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("file:/data/words/part-0.parquet", "/data/words/part-0.parquet"),
        ("file:///data/with%20space/a.json", "/data/with space/a.json"),
        ("/data/plain.csv", "/data/plain.csv"),
        ("s3a://bucket/key.parquet", "s3a://bucket/key.parquet"),
    ],
)
def test_a_file_spark_names_by_uri_has_its_local_path(uri, path):
    assert local_path(uri) == path
