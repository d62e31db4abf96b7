"""Files named by their first offset (Kafka Connect's convention, ``file_name_template``): a
begin looks up the next names (``stat``, footer) from where the partition ended instead of
listing its folder, and gives what a full listing gives; a gap in the names is an
``OffsetGapError`` naming the partition and the file, never crossed. What a begin finds is kept
in the source's catalog, shared by every process (the log's Postgres; here a ``MemoryCatalog``):
a new task process is a fresh source object bound to the same catalog."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.rules.exceptions import OffsetGapError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources import parquet_discovery
from airflow_txn_provider.sources.catalog import MemoryCatalog
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import record

OLD = time.time_ns() - 3600 * 10**9
TEMPLATE = "part-{offset:06d}.parquet"

Fresh = Callable[[], PartitionedParquetSource]


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


def names(*offsets: int) -> set[str]:
    return {TEMPLATE.format(offset=o) for o in offsets}


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

    monkeypatch.setattr(pq, "ParquetFile", footer)
    monkeypatch.setattr(os, "listdir", listdir)
    return seen


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "ds"


@pytest.fixture
def catalog() -> MemoryCatalog:
    """The catalog every process shares (stands for the log's Postgres)."""
    return MemoryCatalog()


@pytest.fixture
def fresh(root, catalog) -> Fresh:
    """A new task process's source: nothing in memory, bound to the shared catalog."""

    def make() -> PartitionedParquetSource:
        source = PartitionedParquetSource(str(root), 1000, file_name_template=TEMPLATE)
        return source.with_catalog(catalog)

    return make


@pytest.fixture
def history(root, fresh) -> Path:
    """Partition 0 with 20 files of 5 offsets, in the catalog by a first begin."""
    for i in range(20):
        land(root, "0", i * 5, 5, i)
    assert fresh().latest_offsets() == {"0": 100}
    return root


def test_new_files_are_found_by_name_without_listing_the_partition(history, fresh, watched):
    root = history
    for first, rows in ((100, 3), (103, 1), (104, 6)):
        land(root, "0", first, rows, None)  # just landed: the folder was just modified
    source = fresh()
    source.prefetch()
    assert source.initialize_transaction(5, {"0": [90, 100]}) == {"0": [100, 110]}
    assert watched["footers"] == [TEMPLATE.format(offset=o) for o in (100, 103, 104)]
    assert "p=0" not in watched["listed"]
    # a job (another process) finds the batch's files in the catalog: no footer, no listing
    watched["footers"].clear()
    assert fresh()._files_holding(str(root), "0", 102, 105) == [
        f"{root}/p=0/{TEMPLATE.format(offset=o)}" for o in (100, 103, 104)
    ]
    assert watched["footers"] == [] and "p=0" not in watched["listed"]
    # nothing new since: one look-up of the next name, no listing, no footer
    assert fresh().latest_offsets() == {"0": 110}
    assert watched["footers"] == [] and "p=0" not in watched["listed"]


def test_a_source_without_a_catalog_keeps_its_own(root):
    """Used without a log (a notebook): its own MemoryCatalog, kept on the object, so what a
    begin found is not looked up again by the next one of the same object."""
    land(root, "0", 0, 5, 1)
    source = PartitionedParquetSource(str(root), 1000, file_name_template=TEMPLATE)
    assert isinstance(source.catalog, MemoryCatalog) and source.catalog is source.catalog
    assert source.latest_offsets() == {"0": 5}
    assert set(source.catalog.names(source.catalog_key(), ["0"])["0"]) == names(0)
    other = PartitionedParquetSource(str(root), 1000, file_name_template=TEMPLATE)
    assert other.catalog is not source.catalog
    assert other.catalog.partitions(other.catalog_key()) == {}


def test_a_gap_in_the_names_is_an_error_naming_the_partition_and_file(
    history, fresh, catalog, watched
):
    root = history
    after = land(root, "0", 103, 2, 30)  # no file named for offset 100
    with pytest.raises(OffsetGapError, match=r"partition '0': no file part-000100\.parquet") as err:
        fresh().latest_offsets()
    assert (err.value.partition, err.value.file) == ("0", str(after))
    key = fresh().catalog_key()
    assert catalog.partitions(key)["0"].end == 100  # not recorded past the gap
    assert set(catalog.names(key, ["0"])["0"]) == names(*range(0, 100, 5))
    with pytest.raises(OffsetGapError):  # the next begin says it again
        fresh().initialize_transaction(5, {"0": [95, 100]})
    land(root, "0", 100, 3, 31)  # the missing file lands
    assert fresh().latest_offsets() == {"0": 105}
    assert set(catalog.names(key, ["0"])["0"]) == names(*range(0, 100, 5), 100, 103)


def test_a_gap_younger_than_the_margin_waits(history, fresh):
    """Files may land out of order: a file after a missing one, modified less than the margin
    ago, is kept out (the end stays before the gap) and looked at again next time."""
    root = history
    land(root, "0", 103, 2, None)
    assert fresh().latest_offsets() == {"0": 100}
    land(root, "0", 100, 3, None)
    assert fresh().latest_offsets() == {"0": 105}


def test_a_file_whose_first_offset_is_not_its_name_is_refused(history, fresh):
    root = history
    wrong = root / "p=0" / TEMPLATE.format(offset=100)
    land(root, "0", 102, 3, 30).rename(wrong)  # holds 102..104, named for 100
    with pytest.raises(OffsetGapError, match="named for offset 100 but its first offset is 102"):
        fresh().latest_offsets()


def test_a_file_still_being_written_is_not_trusted(history, fresh, catalog):
    root = history
    complete = land(root, "0", 100, 4, 30).read_bytes()
    writing = root / "p=0" / TEMPLATE.format(offset=100)
    writing.write_bytes(complete[: len(complete) // 2])  # no footer yet, just modified
    assert fresh().latest_offsets() == {"0": 100}  # not there yet: no error, looked at again
    assert TEMPLATE.format(offset=100) not in set(catalog.names(fresh().catalog_key(), ["0"])["0"])
    writing.write_bytes(complete)
    assert fresh().latest_offsets() == {"0": 104}
    # unreadable past the margin: not a file being written, an error
    broken = root / "p=0" / TEMPLATE.format(offset=104)
    broken.write_bytes(b"not parquet")
    aged(broken, 40)
    with pytest.raises(ValueError):
        fresh().latest_offsets()


def test_a_wakers_poll_looks_again_while_a_file_is_written_under_the_next_name(history, fresh):
    """A waker polls with one object, whose settled look stands while its folders are
    unchanged; a file written in place under the partition's next name changes no folder once
    created, so while such a file is there each poll looks again, and finds it once complete."""
    root = history
    aged(root, 0)  # the dataset's folder settled too
    waker = fresh()

    def poll(txid: int) -> dict | None:
        waker.prefetch()
        return waker.initialize_transaction(txid, {"0": [95, 100]})

    assert poll(1) is None
    land(root, "0", 100, 4, 30)
    complete = land(root, "0", 104, 4, 31).read_bytes()
    writing = root / "p=0" / TEMPLATE.format(offset=104)
    writing.write_bytes(complete[: len(complete) // 2])  # no footer yet, just modified
    aged(root / "p=0", 31)
    assert poll(2) == {"0": [100, 104]}  # the next file is being written: not there yet
    writing.write_bytes(complete)
    aged(root / "p=0", 31)  # the folder as the look saw it: only the file tells
    assert poll(3) == {"0": [100, 108]}


def test_deleted_files_leave_the_catalog(history, fresh, catalog, watched):
    """Retention deletes old files: the folder changed but no file has the next name, so it is
    listed once and the deleted files leave the catalog (the Spark side does not select them)."""
    root = history
    for i in range(5):
        (root / "p=0" / TEMPLATE.format(offset=i * 5)).unlink()
    aged(root / "p=0", 50)
    assert fresh().latest_offsets() == {"0": 100}
    assert watched["listed"].count("p=0") == 1
    assert watched["footers"] == []  # the files known already are not read again
    assert set(catalog.names(fresh().catalog_key(), ["0"])["0"]) == names(*range(25, 100, 5))
    assert fresh()._files_holding(str(root), "0", 0, 30) == [
        f"{root}/p=0/{TEMPLATE.format(offset=o)}" for o in (25,)
    ]
    land(root, "0", 100, 5, 51)
    watched["listed"].clear()
    assert fresh().latest_offsets() == {"0": 105}
    assert "p=0" not in watched["listed"]


def test_a_batchs_files_deleted_behind_a_next_name_are_not_handed_to_its_read(
    history, fresh, watched
):
    """Retention deletes a replayed batch's files while the next file lands: a look-up by name
    finds the new file and lists nothing, so the catalog still names the deleted ones. The batch's
    read lists the folder rather than hand Spark files that are gone: it reads the folder, and the
    count check names the records missing (not a crash on a missing path)."""
    root = history
    for first in (50, 55):
        (root / "p=0" / TEMPLATE.format(offset=first)).unlink()
    land(root, "0", 100, 5, None)  # just now: the folder's hourly listing is not due
    assert fresh().latest_offsets() == {"0": 105}
    assert "p=0" not in watched["listed"]
    assert fresh()._files_holding(str(root), "0", 50, 60) == [f"{root}/p=0"]
    assert watched["listed"].count("p=0") == 1


def test_files_deleted_while_new_ones_kept_landing_leave_at_the_hourly_listing(
    history, fresh, catalog, watched
):
    """A stream never leaves the folder without a next name, so no begin lists it for a gap;
    once its last listing is older than ``RELIST_NAMED_NS`` it is listed, once, and the files
    deleted meanwhile leave the catalog while the present ones stay."""
    root = history
    key = fresh().catalog_key()
    for i in range(20, 40):
        land(root, "0", i * 5, 5, i)
        (root / "p=0" / TEMPLATE.format(offset=(i - 20) * 5)).unlink()  # retention
        assert fresh().latest_offsets() == {"0": i * 5 + 5}
    assert "p=0" not in watched["listed"]  # every begin looked up the next name
    present = {f.name for f in (root / "p=0").iterdir()}  # (a listing: counted from here)
    assert present == names(*range(100, 200, 5))
    watched["listed"].clear()
    deleted = names(*range(0, 100, 5))
    assert set(catalog.names(key, ["0"])["0"]) == present | deleted  # not listed: still known
    # the folder's last listing is now more than RELIST_NAMED_NS ago
    ino, mtime_ns, listed_at = catalog.partitions(key)["0"].folders[""]
    long_ago = listed_at - parquet_discovery.RELIST_NAMED_NS - 1
    record(catalog, key, "0", {"": (ino, mtime_ns, long_ago)}, {}, ())
    watched["footers"].clear()
    assert fresh().latest_offsets() == {"0": 200}
    assert watched["listed"].count("p=0") == 1
    assert watched["footers"] == []  # present files known already: no footer read again
    assert set(catalog.names(key, ["0"])["0"]) == present
    assert catalog.meeting(key, "0", 0, 100) == {}
    assert fresh()._files_holding(str(root), "0", 90, 110) == [
        f"{root}/p=0/{TEMPLATE.format(offset=o)}" for o in (100, 105)
    ]
    # listed just now: the next begins look up names again
    land(root, "0", 200, 5, 40)
    (root / "p=0" / TEMPLATE.format(offset=100)).unlink()
    assert fresh().latest_offsets() == {"0": 205}
    assert watched["listed"].count("p=0") == 1
    assert set(catalog.names(key, ["0"])["0"]) == present | names(200)


def test_a_named_folder_is_relisted_when_due(history, fresh, catalog, watched, monkeypatch):
    """With ``RELIST_NAMED_NS`` 0 every begin is due: the folder is listed instead of looked up
    by name, and a file deleted while another landed leaves the catalog at once."""
    root = history
    monkeypatch.setattr(parquet_discovery, "RELIST_NAMED_NS", 0)
    land(root, "0", 100, 5, None)
    (root / "p=0" / TEMPLATE.format(offset=0)).unlink()
    assert fresh().latest_offsets() == {"0": 105}
    assert watched["listed"].count("p=0") == 1
    assert set(catalog.names(fresh().catalog_key(), ["0"])["0"]) == names(*range(5, 105, 5))


def test_a_file_landing_between_the_prefetch_and_the_lock_is_seen(history, fresh):
    root = history
    land(root, "0", 100, 2, None)
    source = fresh()
    source.prefetch()
    land(root, "0", 102, 3, None)  # after the prefetch: the folder changed, looked at again
    assert source.initialize_transaction(5, {"0": [95, 100]}) == {"0": [100, 105]}


def test_a_file_landing_within_the_folders_timestamp_tick_is_found(history, fresh):
    """A probe's look at a folder is never trusted: a file landing in the same timestamp tick
    (the folder's modification time unchanged) is found by the next begin."""
    root = history
    land(root, "0", 100, 2, None)
    assert fresh().latest_offsets() == {"0": 102}
    folder = (root / "p=0").stat()
    land(root, "0", 102, 3, None)
    os.utime(root / "p=0", ns=(folder.st_atime_ns, folder.st_mtime_ns))  # the same tick
    assert fresh().latest_offsets() == {"0": 105}


def test_a_partition_added_later_is_listed_once_then_probed(history, fresh, catalog, watched):
    root = history
    land(root, "1", 0, 4, 60)
    land(root, "1", 4, 4, 61)
    assert fresh().latest_offsets() == {"0": 100, "1": 8}
    assert watched["listed"].count("p=1") == 1  # nothing known yet: listed
    land(root, "1", 8, 2, 62)
    watched["listed"].clear()
    assert fresh().latest_offsets() == {"0": 100, "1": 10}
    assert "p=1" not in watched["listed"]
    assert set(catalog.partitions(fresh().catalog_key())) == {"0", "1"}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_probing_gives_the_full_listings_batches(tmp_path, seed):
    """Seeded histories: files landing (aged or just modified), old ones deleted, partitions
    added; every begin gives the batch the listing source gives, and the same files."""
    rng = random.Random(seed)
    root = tmp_path / "ds"
    root.mkdir()
    named_catalog, listed_catalog = MemoryCatalog(), MemoryCatalog()

    def named() -> PartitionedParquetSource:
        source = PartitionedParquetSource(str(root), 7, file_name_template=TEMPLATE)
        return source.with_catalog(named_catalog)

    def listed() -> PartitionedParquetSource:
        return PartitionedParquetSource(str(root), 7).with_catalog(listed_catalog)

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
        expected = listed().initialize_transaction(step + 1, prev)
        assert named().initialize_transaction(step + 1, prev) == expected, f"step {step}"
        assert expected == next_offset_ranges(prev, ends, max_per_partition=7) or not ends
        for p, (a, b) in (expected or {}).items():
            if b > a:
                want = listed()._files_holding(str(root), p, a, b)
                assert named()._files_holding(str(root), p, a, b) == want, f"step {step}"
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


@pytest.mark.parametrize(
    "name, says", [(b"\xff.parquet", "is not UTF-8"), (b"x\ny.parquet", "with a newline")]
)
def test_a_name_the_catalog_cannot_keep_is_left_out_with_a_warning(tmp_path, caplog, name, says):
    """Postgres text cannot hold a name that is not UTF-8, the catalog keeps names
    newline-separated: the file is not read (a warning names it), the others are; its offsets
    missing from a batch then fail that batch's count check, never pass unseen."""
    folder = tmp_path / "ds" / "p=0"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"offset": pa.array([0, 1], pa.int64())}), folder / "a.parquet")
    pq.write_table(pa.table({"offset": pa.array([2, 3], pa.int64())}), tmp_path / "b.parquet")
    os.rename(os.fsencode(tmp_path / "b.parquet"), os.path.join(os.fsencode(folder), name))
    source = PartitionedParquetSource(str(tmp_path / "ds"))
    with caplog.at_level("WARNING"):
        assert source.latest_offsets() == {"0": 2}
    assert says in caplog.text
    assert set(source.catalog.names(source.catalog_key(), ["0"])["0"]) == {"a.parquet"}
