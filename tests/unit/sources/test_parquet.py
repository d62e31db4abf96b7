"""A begin's cost does not grow with the source's history: a Parquet source does not list a
partition folder unchanged since it was listed, and reads (``stat``, footer) only the new names
of one that changed (a landing source's look-up: test_landing_source.py). It gives exactly what a
full listing gives, under the transactional contract: files are immutable once complete, new data
arrives as new files, a file may be deleted."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources import file_index, parquet_index
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import SEEDS, age, new_process


@pytest.fixture
def footers_read(monkeypatch):
    opened: list[str] = []
    real = pq.ParquetFile

    def counting(file, *args, **kwargs):
        opened.append(os.path.relpath(str(file)))
        return real(file, *args, **kwargs)

    new_process()
    monkeypatch.setattr(pq, "ParquetFile", counting)
    return opened


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
        st = file.stat()
        found.append((file, file_index.file_offsets(str(file), st.st_mtime_ns, st.st_size, column)))
    return found


def full_listing(source: PartitionedParquetSource) -> dict[str, int]:
    """The latest offsets as every begin found them before: every footer of every file."""
    file_index.file_offsets.cache_clear()
    return {
        p: max((high for _, (_, high) in offset_ranges(d, source.offset_column)), default=-1) + 1
        for p, d in source.partitions().items()
    }


def full_ranges(source: PartitionedParquetSource, partition: str) -> dict[str, tuple[int, int]]:
    directory = Path(source.path) / f"p={partition}"
    return {
        str(f.relative_to(directory)): r for f, r in offset_ranges(directory, source.offset_column)
    }


def index_files(ix: Path) -> list[Path]:
    return sorted(ix.glob("parquet-*/*.idx"))


@pytest.mark.parametrize("seed", SEEDS)
def test_parquet_index_gives_the_full_listings_offsets(tmp_path, seed, footers_read):
    """Seeded random append histories: new files (some in sub-folders, some hidden), old files
    deleted, the newest file of a partition rewritten in place and grown (against the contract,
    but the files holding the newest offsets are looked at every time), new partitions; folders
    aged (unchanged ones are not listed) or just modified (listed). Every begin gives what a
    full listing gives, and so does the Spark side's choice of files."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "ds"
    root.mkdir()
    source = PartitionedParquetSource(
        str(root), max_per_partition=7, index_dir=str(tmp_path / "ix")
    )
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
        new_process()
        assert source.latest_offsets() == expected, f"seed {seed} step {step}"
        new_process()
        source.prefetch()
        batch = source.initialize_transaction(step + 1, prev)
        assert batch == next_offset_ranges(prev, expected, max_per_partition=7)
        for p in expected:
            new_process()
            ranges = full_ranges(source, p)
            found = source._discover({p: root / f"p={p}"}, complete=False, table=True)
            assert found[p].ranges() == ranges, f"seed {seed} step {step} partition {p}"
        prev = batch or prev
    # a new process reads no footer when nothing changed
    new_process()
    footers_read.clear()
    assert source.latest_offsets() == ends
    assert footers_read == []


def test_unchanged_partition_folders_are_not_listed(tmp_path, footers_read, fs_calls):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
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
    new_process()
    footers_read.clear()
    fs_calls["stat"].clear()
    fs_calls["list"].clear()
    assert source.latest_offsets() == {"0": 301, "1": 301}
    assert footers_read == []
    # the dataset's folder (which partitions) and the index folder (gone partitions' indexes)
    assert fs_calls["list"] == [
        str(root),
        str(parquet_index.parquet_index_folder(str(ix), str(root), "offset")),
    ]
    # per partition: its folder, its sub-folder, the file holding the newest offset; no file
    # of the history
    assert sorted(fs_calls["stat"]) == sorted(
        f"{root}/p={p}{rel}" for p in ("0", "1") for rel in ("", "/sub/", "/sub/x.parquet")
    )


def test_a_changed_folder_is_listed_by_name_and_only_new_files_are_read(
    tmp_path, footers_read, fs_calls
):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    for i in range(20):
        write_parquet(root / "p=0" / f"{i:03d}.parquet", range(i * 10, i * 10 + 10))
        age(root / "p=0" / f"{i:03d}.parquet", i)
    age(root / "p=0", 30)
    assert source.latest_offsets() == {"0": 200}
    new_process()
    footers_read.clear()
    fs_calls["stat"].clear()
    write_parquet(root / "p=0" / "020.parquet", range(200, 205))
    write_parquet(root / "p=0" / "021.parquet", range(205, 207))
    (root / "p=0" / "000.parquet").unlink()
    (root / "p=0" / "001.parquet").unlink()
    assert source.latest_offsets() == {"0": 207}
    assert sorted(footers_read) == [
        os.path.relpath(root / "p=0" / f"02{i}.parquet") for i in (0, 1)
    ]
    # the new files, and the one that held the newest offsets (checked for a rewrite)
    file_stats = [s for s in fs_calls["stat"] if s.endswith(".parquet")]
    assert sorted(file_stats) == [str(root / "p=0" / f"{n}.parquet") for n in ("019", "020", "021")]
    # deleted files are dropped: the Spark side does not select them
    assert source._files_holding(str(root), "0", 0, 20) == [f"{root}/p=0"]
    assert source._files_holding(str(root), "0", 15, 25) == [f"{root}/p=0/002.parquet"]
    assert source._files_holding(str(root), "0", 199, 206) == [
        f"{root}/p=0/{n}.parquet" for n in ("019", "020", "021")
    ]
    # the folder was just modified: listed again next time (by name), nothing read
    new_process()
    footers_read.clear()
    assert source.latest_offsets() == {"0": 207}
    assert footers_read == []


def test_the_step_under_the_lock_reuses_the_prefetch(tmp_path, footers_read, fs_calls):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 4, index_dir=str(ix))
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


def test_parquet_contract_only_the_newest_files_are_checked_for_rewrites(tmp_path, footers_read):
    """Files are immutable once complete: an old file rewritten in place under the same name
    is not seen (not every file is looked at); one holding the newest offsets is, and a
    partition that went back below the previous batch stops the begin."""
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    for i in range(5):
        write_parquet(root / "p=0" / f"{i}.parquet", range(i * 10, i * 10 + 10))
        age(root / "p=0" / f"{i}.parquet", i)
    age(root / "p=0", 10)
    assert source.latest_offsets() == {"0": 50}
    new_process()
    footers_read.clear()
    write_parquet(root / "p=0" / "2.parquet", range(20, 25))  # old file: against the contract
    age(root / "p=0" / "2.parquet", 20)
    assert source.latest_offsets() == {"0": 50}
    assert footers_read == []  # not looked at: its old offsets stand
    write_parquet(root / "p=0" / "4.parquet", range(40, 45))  # the newest: looked at
    age(root / "p=0" / "4.parquet", 21)
    new_process()
    assert source.latest_offsets() == {"0": 45}
    assert footers_read == [os.path.relpath(root / "p=0" / "4.parquet")]
    with pytest.raises(OffsetsWentBackError, match="partition '0' went back"):
        source.initialize_transaction(3, {"0": [40, 50]})
    (root / "p=0" / "4.parquet").unlink()  # deleted: the next newest file holds the end
    new_process()
    assert source.latest_offsets() == {"0": 40}


@pytest.mark.parametrize(
    "garbage",
    [b"{not json", b"", b"[]", b'{"ident": 1}\n', b"\xff\xfe"],
    ids=["truncated", "empty", "list", "foreign", "binary"],
)
def test_a_corrupt_parquet_index_is_rebuilt(tmp_path, footers_read, garbage):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    write_parquet(root / "p=0" / "a.parquet", range(0, 10))
    age(root / "p=0" / "a.parquet", 1)
    assert source.latest_offsets() == {"0": 10}
    (index,) = index_files(ix)
    index.write_bytes(garbage)
    new_process()
    footers_read.clear()
    assert source.latest_offsets() == {"0": 10}
    assert len(footers_read) == 1  # read again
    head, name, span, _ = index.read_text().split("\n")
    assert (json.loads(head)["end"], name, span) == (10, "a.parquet", "0 9")


def test_wrong_entries_in_a_parquet_index_are_read_again(tmp_path, footers_read):
    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    write_parquet(root / "p=0" / "a.parquet", range(0, 10))
    age(root / "p=0" / "a.parquet", 1)
    age(root / "p=0", 1)
    source.latest_offsets()
    (index,) = index_files(ix)
    good = index.read_text()
    head = json.loads(good.split("\n")[0])
    for field, broken in (
        ("dirs", {"": ["1", 2, 3]}),
        ("dirs", {"": [1, 2]}),
        ("end", None),
        ("end", -1),
        ("newest", {"a.parquet": [1]}),
    ):
        index.write_text("\n".join([json.dumps({**head, field: broken}), *good.split("\n")[1:]]))
        new_process()
        footers_read.clear()
        assert source.latest_offsets() == {"0": 10}
        assert len(footers_read) == 1, (field, broken)
    # a table that does not match its head, found when the Spark side needs it
    for table in (
        good.replace("0 9", "zero nine"),
        "\n".join([json.dumps({**head, "n": 5}), *good.split("\n")[1:]]),
    ):
        index.write_text(table)
        new_process()
        footers_read.clear()
        assert source._files_holding(str(root), "0", 0, 5) == [f"{root}/p=0/a.parquet"]
        assert len(footers_read) == 1


def test_parquet_index_is_per_dataset_and_offset_column(tmp_path):
    ix = tmp_path / "ix"
    for name in ("a", "b"):
        write_parquet(tmp_path / name / "p=0" / "f.parquet", range(0, 3 if name == "a" else 8))
        age(tmp_path / name / "p=0" / "f.parquet", 1)
    a = PartitionedParquetSource(str(tmp_path / "a"), 100, index_dir=str(ix))
    b = PartitionedParquetSource(str(tmp_path / "b"), 100, index_dir=str(ix))
    new_process()
    assert (a.latest_offsets(), b.latest_offsets()) == ({"0": 3}, {"0": 8})
    assert len(index_files(ix)) == 2
    with pytest.raises(ValueError, match="no column 'line_no'"):
        PartitionedParquetSource(
            str(tmp_path / "a"), index_dir=str(ix), offset_column="line_no"
        ).latest_offsets()


def test_a_gone_partitions_index_is_deleted(tmp_path):
    import shutil

    root, ix = tmp_path / "ds", tmp_path / "ix"
    source = PartitionedParquetSource(str(root), 100, index_dir=str(ix))
    for p in ("0", "1"):
        write_parquet(root / f"p={p}" / "f.parquet", range(0, 4))
    assert source.latest_offsets() == {"0": 4, "1": 4}
    assert len(index_files(ix)) == 2
    shutil.rmtree(root / "p=1")
    assert source.latest_offsets() == {"0": 4}
    assert len(index_files(ix)) == 1


def test_an_unwritable_index_dir_only_costs_time(tmp_path):
    write_parquet(tmp_path / "ds" / "p=0" / "f.parquet", range(0, 4))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    source = PartitionedParquetSource(str(tmp_path / "ds"), 100, index_dir=str(blocker / "ix"))
    assert source.latest_offsets() == {"0": 4}
    assert source._files_holding(str(tmp_path / "ds"), "0", 0, 2) == [
        f"{tmp_path}/ds/p=0/f.parquet"
    ]


def test_default_index_dir_is_private_under_the_temp_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(file_index.tempfile, "tempdir", None)
    write_parquet(tmp_path / "ds" / "p=0" / "f.parquet", range(0, 4))
    age(tmp_path / "ds" / "p=0" / "f.parquet", 1)
    assert PartitionedParquetSource(str(tmp_path / "ds")).latest_offsets() == {"0": 4}
    folder = Path(file_index.default_index_dir())
    assert folder.parent == tmp_path and len(index_files(folder)) == 1
    assert folder.stat().st_mode & 0o777 == 0o700


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
