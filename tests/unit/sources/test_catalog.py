"""The file sources' catalog (sources/catalog.py) in memory: what a look at a partition records
(its end, newest files, names, offset ranges), when a folder's listing is trusted, and how a
source gets its catalog (its own memory, or a bound copy)."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import create_engine

from airflow_txn_provider.sources.catalog import (
    MARGIN_NS,
    MemoryCatalog,
    Partition,
    PostgresCatalog,
    UsesCatalog,
    trusted,
    with_log_catalog,
)
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import record

S = "parquet:/data:offset"
FOLDERS = {"": (11, 1_000, 9_000_000_000), "sub/": (12, 2_000, 9_000_000_000)}


def test_record_gives_the_end_and_the_files_holding_it():
    cat = MemoryCatalog()
    assert cat.partitions(S) == {}
    added = {
        "a.parquet": (100, 1, 0, 9),
        "sub/b.parquet": (200, 2, 10, 19),
        "sub/c.parquet": (300, 3, 15, 19),  # overlaps b, holds the end too
    }
    part = record(cat, S, "0", FOLDERS, added, ())
    expected = Partition(dict(FOLDERS), 20, {"sub/b.parquet": (200, 2), "sub/c.parquet": (300, 3)})
    assert part == expected
    assert cat.partitions(S) == {"0": expected}
    assert set(cat.names(S, ["0"])["0"]) == set(added)
    assert cat.partitions("another") == {} and set(cat.names("another", ["0"])["0"]) == set()
    assert set(cat.names(S, ["1"])["1"]) == set()


def test_end_is_one_past_the_highest_last_offset_not_the_last_file_added():
    cat = MemoryCatalog()
    record(cat, S, "0", {}, {"new.parquet": (1, 1, 50, 59)}, ())
    part = record(cat, S, "0", {}, {"old.parquet": (1, 1, 0, 49)}, ())
    assert (part.end, part.newest) == (60, {"new.parquet": (1, 1)})


def test_a_partition_of_empty_files_or_none_ends_at_0():
    cat = MemoryCatalog()
    part = record(cat, S, "0", FOLDERS, {"empty.parquet": (10, 1, -1, -1)}, ())
    assert part == Partition(dict(FOLDERS), 0, {})
    assert set(cat.names(S, ["0"])["0"]) == {"empty.parquet"}
    assert record(cat, S, "1", FOLDERS, {}, ()) == Partition(dict(FOLDERS), 0, {})
    assert set(cat.partitions(S)) == {"0", "1"}


def test_meeting_is_the_files_whose_offsets_overlap_the_range():
    cat = MemoryCatalog()
    files = {"a": (1, 1, 0, 9), "b": (1, 1, 10, 19), "c": (1, 1, 20, 29), "e": (1, 1, -1, -1)}
    record(cat, S, "0", {}, files, ())
    assert cat.meeting(S, "0", 0, 10) == {"a": (0, 9)}
    assert cat.meeting(S, "0", 9, 11) == {"a": (0, 9), "b": (10, 19)}
    assert cat.meeting(S, "0", 10, 20) == {"b": (10, 19)}
    assert cat.meeting(S, "0", 19, 21) == {"b": (10, 19), "c": (20, 29)}
    assert cat.meeting(S, "0", 30, 40) == {}
    assert cat.meeting(S, "1", 0, 100) == {}
    assert cat.meeting("another", "0", 0, 100) == {}


def test_dropped_files_change_the_end_and_newest():
    cat = MemoryCatalog()
    record(cat, S, "0", {}, {"a": (1, 1, 0, 9), "b": (2, 2, 10, 19), "c": (3, 3, 10, 19)}, ())
    part = record(cat, S, "0", {}, {}, ["b"])
    assert (part.end, part.newest) == (20, {"c": (3, 3)})
    part = record(cat, S, "0", {}, {}, ["c", "not-known"])
    assert (part.end, part.newest) == (10, {"a": (1, 1)})
    assert set(cat.names(S, ["0"])["0"]) == {"a"}
    assert cat.meeting(S, "0", 0, 100) == {"a": (0, 9)}
    part = record(cat, S, "0", {}, {}, ["a"])
    assert (part.end, part.newest) == (0, {})
    assert set(cat.names(S, ["0"])["0"]) == set()


def test_a_file_both_dropped_and_added_is_read_again():
    cat = MemoryCatalog()
    record(cat, S, "0", {}, {"a": (1, 1, 0, 9)}, ())
    part = record(cat, S, "0", {}, {"a": (5, 7, 0, 14)}, ["a"])
    assert (part.end, part.newest) == (15, {"a": (5, 7)})
    assert set(cat.names(S, ["0"])["0"]) == {"a"}


def test_folders_are_replaced_by_each_look():
    cat = MemoryCatalog()
    record(cat, S, "0", FOLDERS, {"a": (1, 1, 0, 9)}, ())
    part = record(cat, S, "0", {"": (11, 5_000, 9_000_000_000)}, {}, ())
    assert part.folders == {"": (11, 5_000, 9_000_000_000)}
    assert cat.partitions(S)["0"].folders == {"": (11, 5_000, 9_000_000_000)}
    assert part.end == 10  # files kept


def test_forget_drops_partitions_and_their_files_only():
    cat = MemoryCatalog()
    for p in ("0", "1", "2"):
        record(cat, S, p, FOLDERS, {f"{p}.parquet": (1, 1, 0, int(p))}, ())
    record(cat, "other", "0", FOLDERS, {"x": (1, 1, 0, 3)}, ())
    cat.forget(S, ["0", "2", "never-known"])
    assert set(cat.partitions(S)) == {"1"}
    assert set(cat.names(S, ["0"])["0"]) == set() and cat.meeting(S, "0", 0, 100) == {}
    assert set(cat.names(S, ["1"])["1"]) == {"1.parquet"}
    assert cat.partitions("other")["0"].end == 4  # another source's partition "0" is kept
    cat.forget(S, [])
    assert set(cat.partitions(S)) == {"1"}


def test_what_the_catalog_returns_is_a_copy():
    cat = MemoryCatalog()
    part = record(cat, S, "0", FOLDERS, {"a": (1, 1, 0, 9)}, ())
    part.folders.clear()
    part.newest.clear()
    cat.partitions(S)["0"].folders["x/"] = (1, 2, 3)
    cat.names(S, ["0"])["0"].append("b")
    assert cat.partitions(S)["0"] == Partition(dict(FOLDERS), 10, {"a": (1, 1)})
    assert set(cat.names(S, ["0"])["0"]) == {"a"}


def test_trusted_needs_the_same_stamp_listed_well_after_the_change():
    listed_at = 100 * 10**9
    well_before = listed_at - MARGIN_NS - 1
    assert trusted((7, well_before, listed_at), 7, well_before)
    assert not trusted(None, 7, well_before)
    assert not trusted((8, well_before, listed_at), 7, well_before)  # folder replaced
    assert not trusted((7, well_before, listed_at), 7, well_before + 1)  # folder changed
    # changed too shortly before its listing: may change again within its timestamp tick
    for mtime in (listed_at - MARGIN_NS, listed_at - 1, listed_at, listed_at + 1):
        assert not trusted((7, mtime, listed_at), 7, mtime), mtime


# -- UsesCatalog ------------------------------------------------------------------------------


def sources(tmp_path):
    return [
        PartitionedParquetSource(str(tmp_path / "lake")),
        LandingDirectorySource(str(tmp_path / "landing")),
    ]


def test_an_unbound_source_keeps_its_own_memory_catalog(tmp_path):
    for source in sources(tmp_path):
        assert isinstance(source, UsesCatalog)
        assert "_catalog" not in source.__dict__
        cat = source.catalog
        assert isinstance(cat, MemoryCatalog)
        assert source.catalog is cat  # kept on the object
        twin = dataclasses.replace(source)
        assert twin == source and twin.catalog is not cat  # each object its own


def test_with_catalog_is_a_bound_copy_without_a_pending_prefetch(tmp_path):
    for source in sources(tmp_path):
        own = source.catalog
        object.__setattr__(source, "_prefetched", ("pending",))
        shared = MemoryCatalog()
        bound = source.with_catalog(shared)
        assert bound is not source and type(bound) is type(source)
        assert bound == source  # the same fields
        assert bound.catalog is shared
        assert "_prefetched" not in bound.__dict__  # another catalog's answer: not reused
        assert source.catalog is own  # the original unbound
        assert source.__dict__["_prefetched"] == ("pending",)
        assert bound.with_catalog(own).catalog is own and bound.catalog is shared


def test_with_catalog_of_a_never_used_source_leaves_it_unbound(tmp_path):
    source = PartitionedParquetSource(str(tmp_path / "lake"))
    bound = source.with_catalog(MemoryCatalog())
    assert "_catalog" not in source.__dict__
    assert source.catalog is not bound.catalog


def test_with_log_catalog_binds_a_copy_to_postgres(tmp_path):
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    try:
        for source in sources(tmp_path):
            bound = with_log_catalog(source, engine)
            assert bound == source and bound is not source
            assert isinstance(bound.catalog, PostgresCatalog)
            assert bound.catalog.engine is engine
            assert isinstance(source.catalog, MemoryCatalog)
    finally:
        engine.dispose()


def test_with_log_catalog_leaves_a_source_without_a_catalog_unchanged():
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    try:
        source = GeneratedTextSource()
        assert not isinstance(source, UsesCatalog)
        assert with_log_catalog(source, engine) is source
        assert "_catalog" not in source.__dict__
    finally:
        engine.dispose()


@pytest.mark.parametrize("cls", [PartitionedParquetSource, LandingDirectorySource])
def test_catalog_key_names_the_dataset_the_same_for_every_copy(tmp_path, cls):
    a, b = cls(str(tmp_path / "x")), cls(str(tmp_path / "x"))
    assert a.catalog_key() == b.catalog_key() == a.with_catalog(MemoryCatalog()).catalog_key()
    assert cls(str(tmp_path / "y")).catalog_key() != a.catalog_key()
