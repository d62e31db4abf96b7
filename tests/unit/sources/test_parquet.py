"""A begin's cost does not grow with the source's history: a Parquet source does not list a
partition folder unchanged since it was listed, and reads (``stat``, footer) only the new names
of one that changed (a landing source's look-up: test_landing_source.py). It gives exactly what a
full listing gives, under the transactional contract: files are immutable once complete, new data
arrives as new files, a file may be deleted.

What discovery found is kept in a catalog (the log's Postgres, shared by every process and host):
here one :class:`MemoryCatalog` per test stands in for it, and a new process is a new source
object bound to that catalog (:func:`in_new_process`), with nothing in memory of its own."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources import parquet, parquet_discovery
from airflow_txn_provider.sources.catalog import MARGIN_NS, MemoryCatalog
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import SEEDS, CountingCatalog, age, record

EVERY_OFFSET = (-1, 2**62)
"""A range every file's offsets meet (a file with no offset is ``(-1, -1)``)."""


@pytest.fixture
def footers_read(monkeypatch):
    opened: list[str] = []
    real = pq.ParquetFile

    def counting(file, *args, **kwargs):
        opened.append(os.path.relpath(str(file)))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", counting)
    return opened


@pytest.fixture
def catalog() -> MemoryCatalog:
    """The catalog every process of a test shares (as they share the log's Postgres)."""
    return MemoryCatalog()


@pytest.fixture
def fs_calls(monkeypatch):
    """Every ``os.stat`` (path) and folder listing (``os.listdir``/``os.scandir``) made."""
    calls: dict[str, list[str]] = {"stat": [], "list": []}
    real_stat, real_listdir, real_scandir = os.stat, os.listdir, os.scandir

    def stat(path, *args, **kwargs):
        calls["stat"].append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    def listdir(path=".", *args, **kwargs):
        calls["list"].append(os.fspath(path))
        return real_listdir(path, *args, **kwargs)

    def scandir(path=".", *args, **kwargs):
        calls["list"].append(os.fspath(path))
        return real_scandir(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return calls


def in_new_process(
    source: PartitionedParquetSource, catalog: MemoryCatalog
) -> PartitionedParquetSource:
    """``source`` as a new task process builds it (from its spec: nothing in memory, no
    prefetch), bound to the catalog every process shares."""
    fresh = dataclasses.replace(source)
    assert "_catalog" not in fresh.__dict__ and "_prefetched" not in fresh.__dict__
    return fresh.with_catalog(catalog)


# -- Parquet -------------------------------------------------------------------------------------


def write_parquet(path: Path, offsets: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"offset": pa.array(offsets, pa.int64()), "line": ["x"] * len(offsets)})
    pq.write_table(table, path)


def offset_ranges(directory: Path, column: str) -> list[tuple[Path, tuple[int, int]]]:
    """Each Parquet file under ``directory`` with its lowest and highest ``column`` value."""
    found = []
    for file in sorted(directory.rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in file.relative_to(directory).parts):
            continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc, _temporary)
        found.append((file, parquet_discovery.file_offsets(str(file), column)))
    return found


def full_listing(source: PartitionedParquetSource) -> dict[str, int]:
    """The latest offsets as every begin found them before: every footer of every file."""
    return {
        p: max((high for _, (_, high) in offset_ranges(d, source.offset_column)), default=-1) + 1
        for p, d in source.partitions().items()
    }


def full_ranges(source: PartitionedParquetSource, partition: str) -> dict[str, tuple[int, int]]:
    """Each file of the partition (relative to its folder) with its offset range, by footer."""
    directory = Path(source.path) / f"{source.partition_column}={partition}"
    return {
        str(f.relative_to(directory)): r for f, r in offset_ranges(directory, source.offset_column)
    }


def known_ranges(catalog: MemoryCatalog, source: PartitionedParquetSource, partition: str):
    """What the catalog holds of the partition's files: name -> offset range."""
    return {
        name: tuple(span)
        for name, span in catalog.meeting(source.catalog_key(), partition, *EVERY_OFFSET).items()
    }


def holding(source: PartitionedParquetSource, partition: str, start: int, end: int) -> list[str]:
    """The files a full listing gives the Spark side for ``[start, end)`` of the partition (the
    partition's folder when none meets it)."""
    directory = f"{source.path}/{source.partition_column}={partition}"
    meeting = [
        f"{directory}/{rel}"
        for rel, (low, high) in full_ranges(source, partition).items()
        if low < end and high >= start
    ]
    return sorted(meeting) or [directory]


@pytest.mark.parametrize("seed", SEEDS)
def test_parquet_discovery_gives_the_full_listings_offsets(tmp_path, seed, footers_read, catalog):
    """Seeded random append histories: new files (some in sub-folders, some hidden), old files
    deleted, the newest file of a partition rewritten in place and grown (against the contract,
    but the files holding the newest offsets are looked at every time), new partitions; folders
    aged (unchanged ones are not listed) or just modified (listed). Every begin, each in a new
    process sharing the catalog, gives what a full listing gives; so do the catalog's files and
    the Spark side's choice of files."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "ds"
    root.mkdir()
    source = PartitionedParquetSource(str(root), max_per_partition=7)
    ends: dict[str, int] = {}
    last: dict[str, tuple[Path, int]] = {}  # each partition's newest file and its first offset
    tick = 0
    prev = None
    for step in range(40):
        for _ in range(rng.randrange(4)):
            tick += 1
            p = str(rng.randrange(4))
            end = ends.get(p, 0)
            action = rng.random()
            if action < 0.15 and p in last:
                target, first = last[p]
                grown = end + rng.randrange(1, 4)
                write_parquet(target, range(first, grown))  # rewritten in place, grown
                ends[p] = grown
            elif action < 0.25:
                target = root / f"p={p}" / f"_tmp-{tick}.parquet"
                write_parquet(target, range(10**6, 10**6 + 3))  # hidden: never an offset
            elif action < 0.4 and p in last:  # an old file deleted (consumed, expired)
                older = [
                    f
                    for f in (root / f"p={p}").rglob("f-*.parquet")
                    if f != last[p][0] and f.exists()
                ]
                if not older:
                    continue
                target = rng.choice(sorted(older))
                target.unlink()
                target = target.parent
            else:
                sub = "sub/" if rng.random() < 0.2 else ""
                target = root / f"p={p}" / f"{sub}f-{tick:04d}.parquet"
                size = rng.randrange(1, 5)
                write_parquet(target, range(end, end + size))
                last[p], ends[p] = (target, end), end + size
            age(target, tick)
            if rng.random() < 0.7:  # else the folders stay just modified: listed every time
                for folder in {target.parent, target, root / f"p={p}"}:
                    if folder.is_dir():
                        age(folder, tick)
        expected = full_listing(source)
        assert {p: end for p, end in expected.items() if end} == ends
        where = f"seed {seed} step {step}"
        assert in_new_process(source, catalog).latest_offsets() == expected, where
        for p in expected:  # what the catalog keeps is the full listing's
            assert known_ranges(catalog, source, p) == full_ranges(source, p), f"{where} p={p}"
        begin = in_new_process(source, catalog)
        begin.prefetch()
        batch = begin.initialize_transaction(step + 1, prev)
        assert batch == next_offset_ranges(prev, expected, max_per_partition=7), where
        for p, end in expected.items():
            if not end:
                continue
            start = rng.randrange(end)
            stop = rng.randrange(start + 1, end + 1)
            job = in_new_process(source, catalog)
            files = job._files_holding(str(root), p, start, stop)
            assert sorted(files) == holding(source, p, start, stop), f"{where} p={p}"
        prev = batch or prev
    # a new process reads no footer when nothing changed
    footers_read.clear()
    assert in_new_process(source, catalog).latest_offsets() == ends
    assert footers_read == []


def test_unchanged_partition_folders_are_not_listed(tmp_path, footers_read, fs_calls, catalog):
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    for p in ("0", "1"):
        for i in range(30):
            write_parquet(root / f"p={p}" / f"{i:03d}.parquet", range(i * 10, i * 10 + 10))
            age(root / f"p={p}" / f"{i:03d}.parquet", i)
        write_parquet(root / f"p={p}" / "sub" / "x.parquet", range(300, 301))
        age(root / f"p={p}" / "sub" / "x.parquet", 40)
        age(root / f"p={p}" / "sub", 40)
        age(root / f"p={p}", 41)
    assert source.latest_offsets() == {"0": 301, "1": 301}
    assert len(footers_read) == 62
    again = in_new_process(source, catalog)
    footers_read.clear()
    fs_calls["stat"].clear()
    fs_calls["list"].clear()
    assert again.latest_offsets() == {"0": 301, "1": 301}
    assert footers_read == []
    # the dataset's folder only (which partitions there are)
    assert fs_calls["list"] == [str(root)]
    # per partition: its folder, its sub-folder, the file holding the newest offset; no file
    # of the history
    assert sorted(fs_calls["stat"]) == sorted(
        f"{root}/p={p}{rel}" for p in ("0", "1") for rel in ("", "/sub/", "/sub/x.parquet")
    )
    # what spared it is the shared catalog: a source with a catalog of its own reads every
    # footer again
    footers_read.clear()
    assert dataclasses.replace(source).latest_offsets() == {"0": 301, "1": 301}
    assert len(footers_read) == 62


def test_a_begin_reads_the_known_names_of_the_folders_it_lists_in_one_query(tmp_path):
    """Only the partitions whose folder changed since a trusted listing have their known names
    read (they are compared with the listing), all of them in one query."""
    root = tmp_path / "ds"

    catalog = CountingCatalog()
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    for p in ("0", "1", "2"):
        write_parquet(root / f"p={p}" / "a.parquet", range(0, 10))
        age(root / f"p={p}" / "a.parquet", 1)
        age(root / f"p={p}", 2)
    assert source.latest_offsets() == {"0": 10, "1": 10, "2": 10}
    assert catalog.names_asked == []  # nothing known yet: nothing to compare with
    for p in ("0", "2"):
        write_parquet(root / f"p={p}" / "b.parquet", range(10, 15))
    assert in_new_process(source, catalog).latest_offsets() == {"0": 15, "1": 10, "2": 15}
    assert catalog.names_asked == [["0", "2"]]


def test_a_source_without_a_log_keeps_what_it_found_in_its_own_memory(tmp_path, footers_read):
    root = tmp_path / "ds"
    write_parquet(root / "p=0" / "a.parquet", range(0, 10))
    age(root / "p=0" / "a.parquet", 1)
    age(root / "p=0", 2)
    source = PartitionedParquetSource(str(root), 100)
    assert source.catalog is source.catalog
    assert isinstance(source.catalog, MemoryCatalog)
    assert source.latest_offsets() == {"0": 10}
    assert source.latest_offsets() == {"0": 10}
    assert footers_read == [os.path.relpath(root / "p=0" / "a.parquet")]  # read once
    other = PartitionedParquetSource(str(root), 100)
    assert other.catalog is not source.catalog
    assert other.catalog.partitions(other.catalog_key()) == {}
    # bound to a catalog: that one is used, the source's own is left alone
    shared = MemoryCatalog()
    bound = source.with_catalog(shared)
    assert bound.catalog is shared and source.catalog is not shared
    assert bound.latest_offsets() == {"0": 10}
    assert set(shared.partitions(bound.catalog_key())) == {"0"}


def test_a_changed_folder_is_listed_by_name_and_only_new_files_are_read(
    tmp_path, footers_read, fs_calls, catalog
):
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    for i in range(20):
        write_parquet(root / "p=0" / f"{i:03d}.parquet", range(i * 10, i * 10 + 10))
        age(root / "p=0" / f"{i:03d}.parquet", i)
    age(root / "p=0", 30)
    assert source.latest_offsets() == {"0": 200}
    again = in_new_process(source, catalog)
    footers_read.clear()
    fs_calls["stat"].clear()
    write_parquet(root / "p=0" / "020.parquet", range(200, 205))
    write_parquet(root / "p=0" / "021.parquet", range(205, 207))
    (root / "p=0" / "000.parquet").unlink()
    (root / "p=0" / "001.parquet").unlink()
    assert again.latest_offsets() == {"0": 207}
    assert sorted(footers_read) == [
        os.path.relpath(root / "p=0" / f"02{i}.parquet") for i in (0, 1)
    ]
    # the new files, and the one that held the newest offsets (checked for a rewrite)
    file_stats = [s for s in fs_calls["stat"] if s.endswith(".parquet")]
    assert sorted(file_stats) == [str(root / "p=0" / f"{n}.parquet") for n in ("019", "020", "021")]
    # deleted files are dropped: the Spark side (a job, in a process of its own) does not
    # select them
    assert set(catalog.names(source.catalog_key(), ["0"])["0"]) == {
        f"{i:03d}.parquet" for i in range(2, 22)
    }
    job = in_new_process(source, catalog)
    footers_read.clear()
    assert job._files_holding(str(root), "0", 0, 20) == [f"{root}/p=0"]
    assert job._files_holding(str(root), "0", 15, 25) == [f"{root}/p=0/002.parquet"]
    assert job._files_holding(str(root), "0", 199, 206) == [
        f"{root}/p=0/{n}.parquet" for n in ("019", "020", "021")
    ]
    assert footers_read == []
    # the folder was just modified: listed again next time (by name), nothing read
    fs_calls["list"].clear()
    assert in_new_process(source, catalog).latest_offsets() == {"0": 207}
    assert footers_read == []
    assert fs_calls["list"] == [str(root), f"{root}/p=0"]


def test_a_wakers_polls_reuse_a_settled_look_until_a_folder_changes(tmp_path, monkeypatch):
    """A waker polls with one source object: a look whose folders had not changed for
    ``MARGIN_NS`` before it stands for the next polls (no catalog read) while they stay so, for
    at most ``PREFETCH_REUSE_S``; a changed folder, or one changed just before the look (a
    change may hide in its timestamp tick), is looked at again."""
    root = tmp_path / "ds"

    catalog = CountingCatalog()
    waker = PartitionedParquetSource(str(root), 100).with_catalog(catalog)

    def poll(txid: int, prev: dict) -> dict | None:
        waker.prefetch()
        return waker.initialize_transaction(txid, prev)

    write_parquet(root / "p=0" / "a.parquet", range(0, 10))
    age(root / "p=0" / "a.parquet", 1)
    age(root / "p=0", 2)
    age(root, 3)
    assert poll(1, {"0": [0, 10]}) is None and catalog.partition_reads == 1
    for txid in range(2, 5):  # idle: the settled look stands
        assert poll(txid, {"0": [0, 10]}) is None
    assert catalog.partition_reads == 1
    write_parquet(root / "p=0" / "b.parquet", range(10, 15))  # the folder changed: looked at
    assert poll(5, {"0": [0, 10]}) == {"0": [10, 15]} and catalog.partition_reads == 2
    assert poll(6, {"0": [10, 15]}) is None  # just changed: not settled, looked at again
    assert catalog.partition_reads == 3
    age(root / "p=0", 4)  # settled (as 2 s later): one look more, then it stands
    assert [poll(7, {"0": [10, 15]}), poll(8, {"0": [10, 15]})] == [None, None]
    assert catalog.partition_reads == 4
    monkeypatch.setattr(parquet, "PREFETCH_REUSE_S", 0.0)  # older than it may be: looked at
    waker.prefetch()
    assert catalog.partition_reads == 5
    copy = waker.with_catalog(catalog)  # another object: its own look
    copy.prefetch()
    assert catalog.partition_reads == 6


def test_the_step_under_the_lock_reuses_the_prefetch(tmp_path, footers_read, fs_calls, catalog):
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 4).with_catalog(catalog)
    write_parquet(root / "p=0" / "a.parquet", range(0, 10))  # just written: folder not trusted
    source.prefetch()
    listed = len(fs_calls["list"])
    assert listed >= 2
    assert source.initialize_transaction(1, None) == {"0": [0, 4]}
    assert len(fs_calls["list"]) == listed  # no second pass: one stat per folder
    assert footers_read == [os.path.relpath(root / "p=0" / "a.parquet")]
    # something changed between the prefetch and the lock: looked at again, new files only
    source.prefetch()
    write_parquet(root / "p=1" / "b.parquet", range(0, 3))
    assert source.initialize_transaction(2, {"0": [0, 4]}) == {"0": [4, 8], "1": [0, 3]}
    assert footers_read[1:] == [os.path.relpath(root / "p=1" / "b.parquet")]
    # a prefetch is used once: the next begin looks again
    listed = len(fs_calls["list"])
    assert source.initialize_transaction(3, {"0": [4, 8], "1": [0, 3]}) == {
        "0": [8, 10],
        "1": [3, 3],
    }
    assert len(fs_calls["list"]) > listed
    # a prefetch belongs to its object: a new process (or a copy bound to a catalog) looks again
    source.prefetch()
    for other in (in_new_process(source, catalog), source.with_catalog(catalog)):
        listed = len(fs_calls["list"])
        assert other.initialize_transaction(4, {"0": [4, 8], "1": [0, 3]}) == {
            "0": [8, 10],
            "1": [3, 3],
        }
        assert len(fs_calls["list"]) > listed
    assert footers_read[2:] == []


def test_parquet_contract_only_the_newest_files_are_checked_for_rewrites(
    tmp_path, footers_read, catalog
):
    """Files are immutable once complete: an old file rewritten in place under the same name
    is not seen (not every file is looked at); one holding the newest offsets is, and a
    partition that went back below the previous batch stops the begin."""
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    for i in range(5):
        write_parquet(root / "p=0" / f"{i}.parquet", range(i * 10, i * 10 + 10))
        age(root / "p=0" / f"{i}.parquet", i)
    age(root / "p=0", 10)
    assert source.latest_offsets() == {"0": 50}
    footers_read.clear()
    write_parquet(root / "p=0" / "2.parquet", range(20, 25))  # old file: against the contract
    age(root / "p=0" / "2.parquet", 20)
    assert in_new_process(source, catalog).latest_offsets() == {"0": 50}
    assert footers_read == []  # not looked at: its old offsets stand
    write_parquet(root / "p=0" / "4.parquet", range(40, 45))  # the newest: looked at
    age(root / "p=0" / "4.parquet", 21)
    again = in_new_process(source, catalog)
    assert again.latest_offsets() == {"0": 45}
    assert footers_read == [os.path.relpath(root / "p=0" / "4.parquet")]
    with pytest.raises(OffsetsWentBackError, match="partition '0' went back"):
        in_new_process(source, catalog).initialize_transaction(3, {"0": [40, 50]})
    (root / "p=0" / "4.parquet").unlink()  # deleted: the next newest file holds the end
    assert in_new_process(source, catalog).latest_offsets() == {"0": 40}


def _stamp(folder: Path) -> tuple[int, int]:
    st = os.stat(folder)
    return st.st_ino, st.st_mtime_ns


def _facts(file: Path, low: int, high: int) -> tuple[int, int, int, int]:
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns, low, high


def _stale_entries(case: str, folder: Path) -> tuple[dict, dict]:
    """A wrong catalog entry of ``folder`` (files ``a`` 0..9 and ``b`` 10..19): its folders and
    files, as some earlier or foreign look recorded them."""
    a, b = folder / "a.parquet", folder / "b.parquet"
    inode, mtime_ns = _stamp(folder)
    now = time.time_ns()
    if case == "listed before b landed and a file went":  # an earlier mtime, a file gone since
        folders = {"": (inode, mtime_ns - 10**9, now)}
        return folders, {"a.parquet": _facts(a, 0, 9), "gone.parquet": (5, 1, 20, 29)}
    if case == "listed within the folder's timestamp tick":  # b landed unseen in that tick
        folders = {"": (inode, mtime_ns, mtime_ns + MARGIN_NS // 2)}
        return folders, {"a.parquet": _facts(a, 0, 9)}
    if case == "another folder (replaced)":  # the same names, another folder's ranges
        folders = {"": (inode + 1, mtime_ns, now)}
        return folders, {"a.parquet": _facts(a, 0, 9), "b.parquet": _facts(b, 10, 99)}
    if case == "newest file rewritten since":  # the file holding the end, another size
        size, file_mtime, _, _ = _facts(b, 0, 0)
        folders = {"": (inode, mtime_ns, now)}
        return folders, {"a.parquet": _facts(a, 0, 9), "b.parquet": (size + 1, file_mtime, 10, 25)}
    assert case == "a sub-folder gone", case  # its files gone with it, the folder unchanged
    folders = {"": (inode, mtime_ns, now), "sub/": (inode + 7, mtime_ns, now)}
    files = {"a.parquet": _facts(a, 0, 9), "b.parquet": _facts(b, 10, 19)}
    return folders, {**files, "sub/c.parquet": (9, 1, 3, 12)}


STALE = [
    ("listed before b landed and a file went", ["b"]),
    ("listed within the folder's timestamp tick", ["b"]),
    ("another folder (replaced)", ["a", "b"]),
    ("newest file rewritten since", ["b"]),
    ("a sub-folder gone", []),
]


@pytest.mark.parametrize(("case", "read"), STALE, ids=[case for case, _ in STALE])
def test_a_wrong_catalog_entry_is_looked_at_again_and_corrected(
    tmp_path, footers_read, catalog, case, read
):
    """A catalog entry that does not match what a ``stat`` finds now (a stale write, a folder
    replaced, a listing made within the folder's timestamp tick) is not trusted: the folder is
    listed again and the entry corrected, reading the footers it must only."""
    root = tmp_path / "ds"
    folder = root / "p=0"
    write_parquet(folder / "a.parquet", range(0, 10))
    write_parquet(folder / "b.parquet", range(10, 20))
    for tick, path in enumerate((folder / "a.parquet", folder / "b.parquet", folder)):
        age(path, tick)
    source = PartitionedParquetSource(str(root), 100)
    folders, files = _stale_entries(case, folder)
    record(catalog, source.catalog_key(), "0", folders, files, ())
    expected, ranges = full_listing(source), full_ranges(source, "0")
    assert (expected, ranges) == ({"0": 20}, {"a.parquet": (0, 9), "b.parquet": (10, 19)})
    footers_read.clear()
    assert in_new_process(source, catalog).latest_offsets() == expected
    assert known_ranges(catalog, source, "0") == ranges
    assert sorted(footers_read) == [os.path.relpath(folder / f"{n}.parquet") for n in read]
    (part,) = catalog.partitions(source.catalog_key()).values()
    assert set(part.folders) == {""} and part.folders[""][:2] == _stamp(folder)
    assert (part.end, set(part.newest)) == (20, {"b.parquet"})
    # corrected for good: the next process reads nothing and finds the same
    footers_read.clear()
    assert in_new_process(source, catalog).latest_offsets() == {"0": 20}
    assert in_new_process(source, catalog)._files_holding(str(root), "0", 5, 15) == [
        f"{folder}/a.parquet",
        f"{folder}/b.parquet",
    ]
    assert footers_read == []


def test_a_lost_catalog_entry_is_rebuilt(tmp_path, footers_read, catalog):
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    write_parquet(root / "p=0" / "a.parquet", range(0, 10))
    age(root / "p=0" / "a.parquet", 1)
    age(root / "p=0", 2)
    assert source.latest_offsets() == {"0": 10}
    catalog.forget(source.catalog_key(), ["0"])
    footers_read.clear()
    assert in_new_process(source, catalog).latest_offsets() == {"0": 10}
    assert footers_read == [os.path.relpath(root / "p=0" / "a.parquet")]  # read again
    assert known_ranges(catalog, source, "0") == {"a.parquet": (0, 9)}
    assert catalog.partitions(source.catalog_key())["0"].end == 10


@pytest.mark.parametrize("wrong", ["a new file missing", "a gone file named", "both"])
def test_the_spark_side_looks_again_when_the_catalog_misses_its_files(
    tmp_path, footers_read, catalog, wrong
):
    """A job's catalog that does not hold the batch's files (found after it was written, or
    naming files gone since) is brought up to date before the files are chosen."""
    root = tmp_path / "ds"
    folder = root / "p=0"
    write_parquet(folder / "a.parquet", range(0, 10))
    write_parquet(folder / "b.parquet", range(10, 20))
    age(folder / "a.parquet", 1)
    age(folder / "b.parquet", 2)
    age(folder, 3)
    source = PartitionedParquetSource(str(root), 100)
    inode, mtime_ns = _stamp(folder)
    a, b = _facts(folder / "a.parquet", 0, 9), _facts(folder / "b.parquet", 10, 19)
    gone = (5, 1, 12, 30)  # c.parquet, deleted since
    files = {
        "a new file missing": {"a.parquet": a},
        "a gone file named": {"a.parquet": a, "b.parquet": b, "c.parquet": gone},
        "both": {"a.parquet": a, "c.parquet": gone},
    }[wrong]
    old = {"": (inode, mtime_ns - 10**9, time.time_ns())}
    record(catalog, source.catalog_key(), "0", old, files, ())
    job = in_new_process(source, catalog)
    assert job._files_holding(str(root), "0", 5, 15) == [
        f"{folder}/a.parquet",
        f"{folder}/b.parquet",
    ]
    assert job._batch_files(str(root), {"0": (10, 20)}) == ({"0": [f"{folder}/b.parquet"]}, True)
    assert known_ranges(catalog, source, "0") == full_ranges(source, "0")


def test_parquet_catalog_entries_are_per_dataset_and_offset_column(tmp_path, footers_read, catalog):
    for name in ("a", "b"):
        write_parquet(tmp_path / name / "p=0" / "f.parquet", range(0, 3 if name == "a" else 8))
        age(tmp_path / name / "p=0" / "f.parquet", 1)
        age(tmp_path / name / "p=0", 2)
    # a dataset with two offset columns
    both = tmp_path / "c" / "p=0" / "f.parquet"
    both.parent.mkdir(parents=True)
    pq.write_table(pa.table({"offset": pa.array(range(5)), "seq": pa.array(range(100, 105))}), both)
    age(both, 1)
    age(both.parent, 2)
    a = PartitionedParquetSource(str(tmp_path / "a"), 100).with_catalog(catalog)
    b = PartitionedParquetSource(str(tmp_path / "b"), 100).with_catalog(catalog)
    c = PartitionedParquetSource(str(tmp_path / "c"), 100).with_catalog(catalog)
    c_seq = PartitionedParquetSource(str(tmp_path / "c"), 100, offset_column="seq")
    c_seq = c_seq.with_catalog(catalog)
    spans = {a: (0, 2), b: (0, 7), c: (0, 4), c_seq: (100, 104)}
    sources = {s: high + 1 for s, (_, high) in spans.items()}
    assert len({s.catalog_key() for s in sources}) == 4
    # the same key in every process (on every host)
    assert all(in_new_process(s, catalog).catalog_key() == s.catalog_key() for s in sources)
    for s, end in sources.items():
        assert s.latest_offsets() == {"0": end}
    assert len(footers_read) == 4
    for s, end in sources.items():  # each its own entry in the one catalog, none overwritten
        assert catalog.partitions(s.catalog_key())["0"].end == end
        assert known_ranges(catalog, s, "0") == {"f.parquet": spans[s]}
    footers_read.clear()
    for s, end in sources.items():
        assert in_new_process(s, catalog).latest_offsets() == {"0": end}
    assert footers_read == []
    with pytest.raises(ValueError, match="no column 'line_no'"):
        PartitionedParquetSource(str(tmp_path / "a"), offset_column="line_no").with_catalog(
            catalog
        ).latest_offsets()


def test_a_gone_partition_leaves_the_catalog(tmp_path, catalog):
    root = tmp_path / "ds"
    source = PartitionedParquetSource(str(root), 100).with_catalog(catalog)
    key = source.catalog_key()
    for p in ("0", "1"):
        write_parquet(root / f"p={p}" / "f.parquet", range(0, 4))
    assert source.latest_offsets() == {"0": 4, "1": 4}
    assert set(catalog.partitions(key)) == {"0", "1"}
    assert set(catalog.names(key, ["1"])["1"]) == {"f.parquet"}
    shutil.rmtree(root / "p=1")
    assert in_new_process(source, catalog).latest_offsets() == {"0": 4}
    assert set(catalog.partitions(key)) == {"0"}
    assert set(catalog.names(key, ["1"])["1"]) == set()
    assert catalog.meeting(key, "1", *EVERY_OFFSET) == {}
    # one reappearing starts afresh
    write_parquet(root / "p=1" / "g.parquet", range(0, 2))
    assert in_new_process(source, catalog).latest_offsets() == {"0": 4, "1": 2}
    assert known_ranges(catalog, source, "1") == {"g.parquet": (0, 1)}


@pytest.mark.parametrize("index_dir", ["unwritable", "a folder", None])
def test_index_dir_is_accepted_and_ignored(tmp_path, monkeypatch, index_dir):
    """``index_dir`` (the per-machine index of earlier versions) still loads from DAG files and
    stored specs, and is ignored: nothing is written there, nor under the temp dir."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    write_parquet(tmp_path / "ds" / "p=0" / "f.parquet", range(0, 4))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    (tmp_path / "ix").mkdir()
    given = {"unwritable": str(blocker / "ix"), "a folder": str(tmp_path / "ix"), None: None}
    before = sorted(tmp_path.rglob("*"))
    source = PartitionedParquetSource(str(tmp_path / "ds"), 2, index_dir=given[index_dir])
    assert source.latest_offsets() == {"0": 4}
    source.prefetch()
    assert source.initialize_transaction(1, None) == {"0": [0, 2]}
    assert source._files_holding(str(tmp_path / "ds"), "0", 0, 2) == [
        f"{tmp_path}/ds/p=0/f.parquet"
    ]
    assert sorted(tmp_path.rglob("*")) == before
    from airflow_txn_provider.rules.specs import from_spec, to_spec
    from airflow_txn_provider.sources.base import SparkSource

    again = from_spec(json.dumps(to_spec(source)), SparkSource, what="source")
    assert again == source and again.index_dir == given[index_dir]
    assert again.catalog_key() == source.catalog_key()
    assert again.latest_offsets() == {"0": 4}


@pytest.mark.parametrize(
    "schema",
    ["", "   ", "p STRING, offset BIGINT", "offset BIGINT, `p` STRING", "offset BIGINT,P INT"],
)
def test_a_declared_schema_is_the_files_columns_only(tmp_path, schema):
    """A declared schema that is empty or names the partition column (the source adds it, as
    a string) is refused when the source is built, not when a txid's batch is read."""
    with pytest.raises(ValueError, match="schema"):
        PartitionedParquetSource(str(tmp_path), schema=schema)


def test_a_declared_schema_travels_in_the_spec(tmp_path):
    from airflow_txn_provider.rules.specs import from_spec, to_spec
    from airflow_txn_provider.sources.base import SparkSource

    source = PartitionedParquetSource(str(tmp_path), schema="offset BIGINT, pid STRING")
    again = from_spec(json.dumps(to_spec(source)), SparkSource, what="source")
    assert again == source and again.schema == "offset BIGINT, pid STRING"
