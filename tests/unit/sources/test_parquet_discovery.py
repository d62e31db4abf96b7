"""Files named by their first offset (Kafka Connect's convention, ``file_name_template``): a
begin looks up the next names (``stat``, footer) from where the partition ended instead of
listing its folder, and gives what a full listing gives; a gap in the names is an
``OffsetGapError`` naming the partition and the file, never crossed."""

from __future__ import annotations

import itertools
import os
import random
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.rules.exceptions import OffsetGapError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources import file_index, parquet_index
from airflow_txn_provider.sources.parquet import PartitionedParquetSource

OLD = time.time_ns() - 3600 * 10**9
TEMPLATE = "part-{offset:06d}.parquet"


def new_process() -> None:
    file_index.file_offsets.cache_clear()
    parquet_index.loaded_partitions.clear()
    file_index.prefetched.clear()


def aged(path: Path, tick: int) -> None:
    os.utime(path, ns=(OLD + tick * 1000, OLD + tick * 1000))


def land(root: Path, p: str, first: int, rows: int, tick: int | None = 0) -> Path:
    """A file of ``rows`` offsets from ``first``, named for ``first``; aged unless tick is None."""
    path = root / f"p={p}" / TEMPLATE.format(offset=first)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = pa.array(range(first, first + rows), pa.int64())
    pq.write_table(pa.table({"offset": offsets, "line": ["x"] * rows}), path)
    if tick is not None:
        aged(path, tick)
        aged(path.parent, tick)
    return path


@pytest.fixture
def watched(monkeypatch):
    """Footers read (file names) and folders listed."""
    seen: dict[str, list[str]] = {"footers": [], "listed": []}
    real_file, real_listdir = pq.ParquetFile, os.listdir

    def footer(file, *args, **kwargs):
        seen["footers"].append(os.path.basename(str(file)))
        return real_file(file, *args, **kwargs)

    def listdir(path=".", *args, **kwargs):
        seen["listed"].append(os.path.basename(os.fspath(path)))
        return real_listdir(path, *args, **kwargs)

    new_process()
    monkeypatch.setattr(pq, "ParquetFile", footer)
    monkeypatch.setattr(os, "listdir", listdir)
    return seen


@pytest.fixture
def history(tmp_path):
    """Partition 0 with 20 files of 5 offsets, indexed by a first begin."""
    root = tmp_path / "ds"
    for i in range(20):
        land(root, "0", i * 5, 5, i)
    source = PartitionedParquetSource(
        str(root), 1000, index_dir=str(tmp_path / "ix"), file_name_template=TEMPLATE
    )
    new_process()
    assert source.latest_offsets() == {"0": 100}
    return source, root


def test_new_files_are_found_by_name_without_listing_the_partition(history, watched):
    source, root = history
    for first, rows in ((100, 3), (103, 1), (104, 6)):
        land(root, "0", first, rows, None)  # just landed: the folder was just modified
    new_process()
    source.prefetch()
    assert source.initialize_transaction(5, {"0": [90, 100]}) == {"0": [100, 110]}
    assert watched["footers"] == [TEMPLATE.format(offset=o) for o in (100, 103, 104)]
    assert "p=0" not in watched["listed"]
    assert source._files_holding(str(root), "0", 102, 105) == [
        f"{root}/p=0/{TEMPLATE.format(offset=o)}" for o in (100, 103, 104)
    ]
    # nothing new since: one look-up of the next name, no listing, no footer
    watched["footers"].clear()
    new_process()
    assert source.latest_offsets() == {"0": 110}
    assert watched["footers"] == [] and "p=0" not in watched["listed"]


def test_a_gap_in_the_names_is_an_error_naming_the_partition_and_file(history, watched):
    source, root = history
    after = land(root, "0", 103, 2, 30)  # no file named for offset 100
    new_process()
    with pytest.raises(OffsetGapError, match=r"partition '0': no file part-000100\.parquet") as err:
        source.latest_offsets()
    assert (err.value.partition, err.value.file) == ("0", str(after))
    new_process()
    with pytest.raises(OffsetGapError):  # not saved past the gap: the next begin says it again
        source.initialize_transaction(5, {"0": [95, 100]})
    land(root, "0", 100, 3, 31)  # the missing file lands
    new_process()
    assert source.latest_offsets() == {"0": 105}


def test_a_gap_younger_than_the_margin_waits(history, watched):
    """Files may land out of order: a file after a missing one, modified less than the margin
    ago, is kept out (the end stays before the gap) and looked at again next time."""
    source, root = history
    land(root, "0", 103, 2, None)
    new_process()
    assert source.latest_offsets() == {"0": 100}
    land(root, "0", 100, 3, None)
    new_process()
    assert source.latest_offsets() == {"0": 105}


def test_a_file_whose_first_offset_is_not_its_name_is_refused(history):
    source, root = history
    wrong = root / "p=0" / TEMPLATE.format(offset=100)
    land(root, "0", 102, 3, 30).rename(wrong)  # holds 102..104, named for 100
    new_process()
    with pytest.raises(OffsetGapError, match="named for offset 100 but its first offset is 102"):
        source.latest_offsets()


def test_a_file_still_being_written_is_not_trusted(history):
    source, root = history
    complete = land(root, "0", 100, 4, 30).read_bytes()
    writing = root / "p=0" / TEMPLATE.format(offset=100)
    writing.write_bytes(complete[: len(complete) // 2])  # no footer yet, just modified
    new_process()
    assert source.latest_offsets() == {"0": 100}  # not there yet: no error, looked at again
    writing.write_bytes(complete)
    new_process()
    assert source.latest_offsets() == {"0": 104}
    # unreadable past the margin: not a file being written, an error
    broken = root / "p=0" / TEMPLATE.format(offset=104)
    broken.write_bytes(b"not parquet")
    aged(broken, 40)
    new_process()
    with pytest.raises(ValueError):
        source.latest_offsets()


def test_deleted_files_leave_the_index(history, watched):
    """Retention deletes old files: the folder changed but no file has the next name, so it is
    listed once and the deleted files leave the table (the Spark side does not select them)."""
    source, root = history
    for i in range(5):
        (root / "p=0" / TEMPLATE.format(offset=i * 5)).unlink()
    aged(root / "p=0", 50)
    new_process()
    assert source.latest_offsets() == {"0": 100}
    assert watched["listed"].count("p=0") == 1
    assert source._files_holding(str(root), "0", 0, 30) == [
        f"{root}/p=0/{TEMPLATE.format(offset=o)}" for o in (25,)
    ]
    land(root, "0", 100, 5, 51)
    watched["listed"].clear()
    new_process()
    assert source.latest_offsets() == {"0": 105}
    assert "p=0" not in watched["listed"]


def test_compaction_drops_files_deleted_while_new_ones_kept_landing(history, monkeypatch):
    """A stream never leaves the folder without a next name, so no begin lists it; the index's
    compaction does, once, and files deleted meanwhile leave the table."""
    source, root = history
    monkeypatch.setattr(parquet_index, "COMPACT_MIN_BYTES", 0)
    (index,) = Path(source.index_dir).glob("parquet-*/*.idx")
    sizes = []
    for i in range(20, 40):
        land(root, "0", i * 5, 5, i)
        (root / "p=0" / TEMPLATE.format(offset=(i - 20) * 5)).unlink()  # retention
        new_process()
        assert source.latest_offsets() == {"0": i * 5 + 5}
        sizes.append(index.stat().st_size)
    assert any(b < a for a, b in itertools.pairwise(sizes))  # compacted at least once
    new_process()
    table = parquet_index.ParquetPartitionIndex(
        str(index.parent), "p=0", source.path, "offset"
    ).load(table=True)
    kept = set(table.table())
    assert kept >= {TEMPLATE.format(offset=o) for o in range(100, 200, 5)}  # the present files
    assert len(kept - {f.name for f in (root / "p=0").iterdir()}) < 10  # few deleted ones left


def test_a_file_landing_between_the_prefetch_and_the_lock_is_seen(history):
    source, root = history
    land(root, "0", 100, 2, None)
    new_process()
    source.prefetch()
    land(root, "0", 102, 3, None)  # after the prefetch: the folder changed, looked at again
    assert source.initialize_transaction(5, {"0": [95, 100]}) == {"0": [100, 105]}


def test_a_file_landing_within_the_folders_timestamp_tick_is_found(history):
    """A probe's look at a folder is never trusted: a file landing in the same timestamp tick
    (the folder's modification time unchanged) is found by the next begin."""
    source, root = history
    land(root, "0", 100, 2, None)
    new_process()
    assert source.latest_offsets() == {"0": 102}
    folder = (root / "p=0").stat()
    land(root, "0", 102, 3, None)
    os.utime(root / "p=0", ns=(folder.st_atime_ns, folder.st_mtime_ns))  # the same tick
    new_process()
    assert source.latest_offsets() == {"0": 105}


def test_a_partition_added_later_is_listed_once_then_probed(history, watched):
    source, root = history
    land(root, "1", 0, 4, 60)
    land(root, "1", 4, 4, 61)
    new_process()
    assert source.latest_offsets() == {"0": 100, "1": 8}
    assert watched["listed"].count("p=1") == 1  # nothing known yet: listed
    land(root, "1", 8, 2, 62)
    watched["listed"].clear()
    new_process()
    assert source.latest_offsets() == {"0": 100, "1": 10}
    assert "p=1" not in watched["listed"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_probing_gives_the_full_listings_batches(tmp_path, seed):
    """Seeded histories: files landing (aged or just modified), old ones deleted, partitions
    added; every begin gives the batch the listing source gives, and the same files."""
    rng = random.Random(seed)
    root = tmp_path / "ds"
    root.mkdir()
    named = PartitionedParquetSource(
        str(root), 7, index_dir=str(tmp_path / "a"), file_name_template=TEMPLATE
    )
    listed = PartitionedParquetSource(str(root), 7, index_dir=str(tmp_path / "b"))
    ends: dict[str, int] = {}
    prev = None
    for step in range(30):
        for tick in range(rng.randrange(4)):
            p = str(rng.randrange(3))
            if rng.random() < 0.2 and ends.get(p):
                files = sorted((root / f"p={p}").glob("part-*.parquet"))[:-1]
                if files:
                    rng.choice(files).unlink()
                    aged(root / f"p={p}", step * 10 + tick)
                continue
            rows = rng.randrange(1, 5)
            land(root, p, ends.get(p, 0), rows, step * 10 + tick if rng.random() < 0.6 else None)
            ends[p] = ends.get(p, 0) + rows
        new_process()
        expected = listed.initialize_transaction(step + 1, prev)
        new_process()
        assert named.initialize_transaction(step + 1, prev) == expected, f"step {step}"
        assert expected == next_offset_ranges(prev, ends, max_per_partition=7) or not ends
        for p, (a, b) in (expected or {}).items():
            if b > a:
                new_process()
                want = listed._files_holding(str(root), p, a, b)
                new_process()
                assert named._files_holding(str(root), p, a, b) == want
        prev = expected or prev


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("part.parquet", "exactly once"),
        ("{offset}-{offset}.parquet", "exactly once"),
        ("part-{offset:x}.parquet", "{offset:0<width>d}"),
        ("part-{offset!r}.parquet", "no conversion"),
        ("{topic}-{offset}.parquet", "unknown field {topic}"),
        ("sub/{offset}.parquet", "no '/'"),
        ("part-{offset}.json", "must end with .parquet"),
        ("_{offset}.parquet", "not start with"),
        ("part-{offset", "expected '}'"),
    ],
)
def test_a_bad_template_is_refused_with_what_is_wrong(template, says):
    with pytest.raises(ValueError, match=f"file_name_template .*{re.escape(says)}"):
        PartitionedParquetSource("/data", file_name_template=template)
