"""Specs: a source or a sink travels to a job as ``{"class": "module:Name", "args": {...}}``, and
a spec written before a built-in source's module moved still loads (Airflow keeps a deferred
waker's spec in its trigger table across an upgrade)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.specs import MOVED_MODULES, from_spec, to_spec
from airflow_txn_provider.sources.base import SparkSource
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource

STORED_BEFORE_THE_MOVE = {
    "airflow_txn_provider.spark.parquet_source:PartitionedParquetSource": (
        PartitionedParquetSource,
        {"path": "/data/events", "max_per_partition": 7, "index_dir": "/tmp/ix"},
    ),
    "airflow_txn_provider.spark.landing_source:LandingDirectorySource": (
        LandingDirectorySource,
        {"path": "/data/landing", "max_files_per_partition": 3, "index_dir": None},
    ),
    "airflow_txn_provider.spark.generated_source:GeneratedTextSource": (
        GeneratedTextSource,
        {"lines_per_second": 5.0, "partitions": 3, "seed": 9},
    ),
}
"""Specs as 0.1's waker stored them (its args as that version's dataclass fields)."""


@pytest.mark.parametrize("path", sorted(STORED_BEFORE_THE_MOVE))
def test_a_spec_naming_a_moved_module_loads_the_class_from_its_new_home(path):
    cls, args = STORED_BEFORE_THE_MOVE[path]
    source = from_spec({"class": path, "args": args}, SparkSource, what="source")
    assert type(source) is cls
    assert {name: getattr(source, name) for name in args} == args
    assert to_spec(source)["class"].startswith("airflow_txn_provider.sources.")


def test_every_moved_module_exists_under_its_new_name():
    import importlib

    for old, new in MOVED_MODULES.items():
        assert old.startswith("airflow_txn_provider.spark."), old
        importlib.import_module(new)


def test_an_unknown_class_is_refused_saying_which():
    with pytest.raises(ValueError, match="cannot load source from spec"):
        from_spec({"class": "airflow_txn_provider.spark.nope:Gone"}, SparkSource, what="source")
    with pytest.raises(ValueError, match="is not a SparkSource"):
        from_spec({"class": "builtins:dict"}, SparkSource, what="source")
