"""The per-partition index of a Parquet dataset (sources/parquet_index.py) is appended to, not
rewritten, by a begin that finds new files: a corrupt last change is ignored, a racing writer
keeps the first change, and the changes are compacted once they outgrow the base."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from airflow_txn_provider.sources import file_index, parquet_discovery, parquet_index
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import write_offsets

OLD = time.time_ns() - 3600 * 10**9  # an hour ago: old enough for a listing to be kept


def new_process() -> None:
    file_index.file_offsets.cache_clear()
    parquet_index.loaded_partitions.clear()
    file_index.prefetched.clear()


def aged(path: Path, tick: int) -> Path:
    os.utime(path, ns=(OLD + tick * 1000, OLD + tick * 1000))
    return path


def land(root: Path, name: str, offsets: range, tick: int) -> None:
    write_offsets(root / "p=0" / name, offsets)
    aged(root / "p=0" / name, tick)
    aged(root / "p=0", tick)


def layout(index: Path) -> tuple[dict, list[str], list[dict]]:
    """The index file's base head, base names, and appended changes."""
    data = index.read_bytes()
    first = data[: data.index(b"\n") + 1]
    head = json.loads(first)
    base = len(first) + head["table_bytes"]
    names = data[len(first) : base].decode().split("\n")[: head["n"]]
    return head, names, [json.loads(line) for line in data[base:].splitlines()]


@pytest.fixture
def dataset(tmp_path, footers_read):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    for i in range(5):
        land(root, f"{i}.parquet", range(i * 10, i * 10 + 10), i)
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    new_process()
    assert source.latest_offsets() == {"0": 50}
    (index,) = ix.glob("parquet-*/*.idx")
    return source, root, index


def test_a_change_is_appended_and_the_base_kept(dataset, footers_read):
    source, root, index = dataset
    before = index.read_bytes()
    head, _, changes = layout(index)
    assert (head["n"], head["end"], changes) == (5, 50, [])
    land(root, "5.parquet", range(50, 53), 10)
    (root / "p=0" / "0.parquet").unlink()
    aged(root / "p=0", 11)
    new_process()
    footers_read.clear()
    assert source.latest_offsets() == {"0": 53}
    assert footers_read == ["5.parquet"]
    after = index.read_bytes()
    assert after.startswith(before)  # appended, the base untouched
    _, _, changes = layout(index)
    assert [(c["end"], c["add"], c["drop"]) for c in changes] == [
        (53, {"5.parquet": "50 52"}, ["0.parquet"])
    ]
    new_process()  # a new process reads the base and the change
    assert source.latest_offsets() == {"0": 53}
    assert source._files_holding(str(root), "0", 0, 20) == [f"{root}/p=0/1.parquet"]
    assert source._files_holding(str(root), "0", 49, 51) == [
        f"{root}/p=0/{n}.parquet" for n in (4, 5)
    ]
    assert footers_read == ["5.parquet"]  # no footer read again: all from the index


@pytest.mark.parametrize(
    "tail", [b'{"dirs": {}, "end"', b"garbage\n", b'{"end": 7}\n'], ids=["half", "text", "partial"]
)
def test_a_corrupt_last_change_is_ignored_and_the_index_rewritten(dataset, footers_read, tail):
    source, root, index = dataset
    land(root, "5.parquet", range(50, 53), 10)
    new_process()
    assert source.latest_offsets() == {"0": 53}
    with open(index, "ab") as f:
        f.write(tail)  # a writer that died mid-append, or another program's bytes
    new_process()
    footers_read.clear()
    assert source.latest_offsets() == {"0": 53}
    assert footers_read == []  # the changes before the corrupt one still stand
    head, names, changes = layout(index)  # rewritten whole, without it
    assert (head["end"], sorted(names), changes) == (53, [f"{i}.parquet" for i in range(6)], [])
    assert tail not in index.read_bytes()


def test_a_racing_writer_keeps_the_first_change(dataset, footers_read):
    """Two processes that read the same index and found the same new file: the first appends,
    the second (the file is no longer what it read) writes nothing; so does one whose index was
    replaced meanwhile, and one that finds the index locked."""
    source, root, index = dataset
    land(root, "5.parquet", range(50, 53), 10)
    folder, column = str(index.parent), "offset"
    one, two = (parquet_index.ParquetPartitionIndex(folder, "p=0", str(root), column) for _ in "12")
    new_process()
    first, second = one.load(), two.load()
    for part in (first, second):
        assert parquet_discovery.refresh_by_listing(part, str(root / "p=0"), column, None)
    one.save(first)
    size = index.stat().st_size
    two.save(second)
    assert index.stat().st_size == size
    assert len(layout(index)[2]) == 1
    # replaced meanwhile (a compaction): the old version's reader writes nothing
    land(root, "6.parquet", range(53, 55), 11)
    new_process()
    stale = one.load()
    assert parquet_discovery.refresh_by_listing(stale, str(root / "p=0"), column, None)
    fresh = two.load(table=True)
    fresh.rewrite = True
    two.save(fresh)  # written whole: a new inode
    replaced = index.read_bytes()
    one.save(stale)
    assert index.read_bytes() == replaced
    # locked by another writer: skipped, never waited for
    new_process()
    locked = one.load()
    assert parquet_discovery.refresh_by_listing(locked, str(root / "p=0"), column, None)
    with open(index, "rb") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        one.save(locked)
    assert index.read_bytes() == replaced
    new_process()
    assert source.latest_offsets() == {"0": 55}


def test_changes_are_compacted_once_they_outgrow_the_base(dataset, footers_read, monkeypatch):
    source, root, index = dataset
    monkeypatch.setattr(parquet_index, "COMPACT_MIN_BYTES", 0)
    base = layout(index)[0]["table_bytes"]
    grown = []
    for i in range(5, 40):
        land(root, f"{i}.parquet", range(i * 10, i * 10 + 10), i + 10)
        new_process()
        assert source.latest_offsets() == {"0": i * 10 + 10}
        head, names, changes = layout(index)
        grown.append(len(changes))
        assert index.stat().st_size - len(json.dumps(head)) - head["table_bytes"] <= (
            0.5 * head["table_bytes"] + 400
        )
    assert max(grown) >= 2 and grown.count(0) >= 2  # appended, then compacted, more than once
    table = set(names).union(*(c["add"] for c in changes))
    assert table == {f"{i}.parquet" for i in range(40)} and head["table_bytes"] > base
    new_process()
    footers_read.clear()
    assert source._files_holding(str(root), "0", 395, 400) == [f"{root}/p=0/39.parquet"]
    assert footers_read == []
