"""A begin's cost does not grow with the landing folder's history (sources/landing.py): the
source looks up the files after where the previous batch ended instead of listing every file ever
landed, and gives exactly what a full listing gives; a partition missing, unreadable or
renumbered is handled as before."""

from __future__ import annotations

import dataclasses
import os
import random
import time

import pytest

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources.landing import LandingDirectorySource
from tests.unit.sources.files_given import (
    SEEDS,
    CountingCatalog,
    LandingHistory,
    age,
    land,
    record,
)


def fresh(source: LandingDirectorySource) -> LandingDirectorySource:
    """The source as another task process builds it from the DAG file, bound to the same
    catalog (what the log's Postgres is to every process)."""
    return dataclasses.replace(source).with_catalog(source.catalog)


@pytest.mark.parametrize("seed", SEEDS)
def test_landing_probe_gives_the_full_listings_batches(tmp_path, seed, monkeypatch):
    """Consecutive numbering, partitions appearing, going offline and back, consumed files
    deleted, idle partitions: every begin's batch is the one the full listing gave."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "landing"
    root.mkdir()
    source = LandingDirectorySource(str(root), max_files_per_partition=3, index_dir=str(tmp_path))
    history = LandingHistory(root, rng, partitions=4, most=5, gaps=False)
    prev = None
    for txid in range(1, 60):
        history.step(prev)
        expected = next_offset_ranges(prev, source.latest_offsets(), max_per_partition=3)
        begin = fresh(source)  # each begin a new process, the catalog shared
        assert begin.initialize_transaction(txid, prev) == expected, f"seed {seed} txid {txid}"
        prev = expected or prev


def test_landing_partition_with_new_files_is_not_listed(tmp_path, monkeypatch):
    """A partition with files at its next numbers is looked up, not listed; one without is
    listed once, then not again while its folder is unchanged, by any source object bound to
    the same catalog (the ``index_dir`` of earlier versions is accepted and ignored)."""
    root = tmp_path / "landing"
    for seq in range(50):
        land(root, "p0", seq, seq)
    land(root, "p1", 0, 0)
    source = LandingDirectorySource(str(root), max_files_per_partition=4, index_dir=str(tmp_path))
    listed: list[str] = []
    real = LandingDirectorySource.files
    monkeypatch.setattr(
        LandingDirectorySource, "files", lambda self, p: listed.append(p) or real(self, p)
    )
    prev = {"p0": [40, 48], "p1": [0, 1]}
    assert source.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 1]}
    assert listed == ["p1"]  # p0 looked up by number; p1 has nothing new: listed once
    assert list(tmp_path.glob("landing-*")) == []  # no index file any more
    for again in (source, fresh(source), fresh(fresh(source))):
        listed.clear()
        assert again.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 1]}
        assert listed == []  # p1's folder unchanged: the catalog says it ends at 0
    listed.clear()
    unbound = LandingDirectorySource(str(root), max_files_per_partition=4)
    assert unbound.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 1]}
    assert listed == ["p1"]  # a catalog of its own: it knows nothing yet
    land(root, "p1", 5, 99)  # a gap in p1's numbering: its folder changed, listed again
    listed.clear()
    assert fresh(source).initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 5]}
    assert listed == ["p1"]
    listed.clear()
    assert fresh(source).initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 5]}
    assert listed == []


def test_landing_gap_is_read_one_batch_later_never_skipped(tmp_path):
    """With a gap, the look-up stops before it; the next begin lists the partition and goes
    past it, as the full listing did."""
    root = tmp_path / "landing"
    for seq in (0, 1, 2, 5, 6):
        land(root, "p0", seq, seq)
    source = LandingDirectorySource(str(root), max_files_per_partition=10, index_dir=str(tmp_path))
    first = source.initialize_transaction(1, None)
    assert first == {"p0": [0, 3]}
    second = source.initialize_transaction(2, first)
    assert second == {"p0": [3, 7]}
    assert source.batch_files(second) == [str(root / "p0" / f"{s}.jsonl") for s in (5, 6)]
    assert source.initialize_transaction(3, second) is None


def test_landing_missing_and_unreadable_partitions_continue_later(tmp_path):
    root = tmp_path / "landing"
    for seq in range(4):
        land(root, "p0", seq, seq)
        land(root, "p1", seq, seq)
    source = LandingDirectorySource(str(root), max_files_per_partition=2, index_dir=str(tmp_path))
    prev = {"p0": [0, 2], "p1": [0, 2]}
    (root / "p0").rename(root / ".p0.offline")
    assert source.initialize_transaction(2, prev) == {"p0": [2, 2], "p1": [2, 4]}
    (root / ".p0.offline").rename(root / "p0")
    if os.geteuid() != 0:  # root reads any folder
        (root / "p1").chmod(0o300)  # can be searched (stat works), cannot be listed
        try:
            assert source.initialize_transaction(2, prev) == {"p0": [2, 4], "p1": [2, 2]}
        finally:
            (root / "p1").chmod(0o755)
    assert source.initialize_transaction(2, prev) == {"p0": [2, 4], "p1": [2, 4]}


def test_landing_empty_and_renumbered_partitions_as_before(tmp_path):
    root = tmp_path / "landing"
    (root / "p0").mkdir(parents=True)
    age(root / "p0", 0)
    source = LandingDirectorySource(str(root), index_dir=str(tmp_path))
    for _ in range(2):  # listed, then from the catalog: the same answer
        assert source.initialize_transaction(4, {"p0": [3, 5]}) is None
    land(root, "p0", 0, 1)  # numbering from 0 again
    for _ in range(2):
        with pytest.raises(OffsetsWentBackError, match="partition 'p0' went back"):
            source.initialize_transaction(4, {"p0": [3, 5]})


def test_a_stale_catalog_entry_is_not_believed(tmp_path, monkeypatch):
    """An entry whose folder stamp no longer matches the folder (another inode, another mtime,
    or a listing too soon after the folder's change) is ignored: the folder is listed again and
    the listing's answer given and recorded. One that matches is believed, unlisted."""
    root = tmp_path / "landing"
    for seq in range(3):
        land(root, "p0", seq, seq)
    source = LandingDirectorySource(str(root))
    key, catalog = source.catalog_key(), source.catalog
    listed: list[str] = []
    real = LandingDirectorySource.files
    monkeypatch.setattr(
        LandingDirectorySource, "files", lambda self, p: listed.append(p) or real(self, p)
    )
    st = os.stat(root / "p0")
    wrong = {"7.jsonl": (1, 1, 7, 7)}  # believed, the batch would be [3, 8)

    def answer_after(folder: tuple[int, int, int]) -> dict | None:
        record(catalog, key, "p0", {"": folder}, wrong, set(catalog.names(key, ["p0"])["p0"]))
        listed.clear()
        return fresh(source).initialize_transaction(2, {"p0": [0, 3]})

    long_after = time.time_ns()
    assert answer_after((st.st_ino, st.st_mtime_ns, long_after)) == {"p0": [3, 8]}
    assert listed == []  # its stamp matches: believed (every entry is checked by a stat only)
    for stale in (
        (st.st_ino + 1, st.st_mtime_ns, long_after),  # another folder at that path
        (st.st_ino, st.st_mtime_ns - 1, long_after),  # the folder changed since
        (st.st_ino, st.st_mtime_ns, st.st_mtime_ns + 1),  # listed as it changed: not trusted
    ):
        assert answer_after(stale) is None, stale  # the listing's answer: p0 ends at 3
        assert listed == ["p0"], stale
        part = catalog.partitions(key)["p0"]
        assert part.end == 3 and set(part.newest) == {"2.jsonl"}, stale  # the entry rewritten
        assert set(catalog.names(key, ["p0"])["p0"]) == {"2.jsonl"}, stale
        assert part.folders[""][:2] == (st.st_ino, st.st_mtime_ns), stale
        listed.clear()
        assert fresh(source).initialize_transaction(2, {"p0": [0, 3]}) is None
        assert listed == [], stale  # the rewritten entry is trusted: not listed again


def test_a_wakers_idle_polls_ask_the_catalog_only_when_a_folder_changed(tmp_path):
    """A waker polls with one source object: a partition with no next file, whose folder is
    still as a trusted listing in the catalog's last answer found it, is not asked about again;
    a folder changed since (or another object) asks the catalog."""
    root = tmp_path / "landing"
    for seq in range(3):
        land(root, "p0", seq, seq)
        land(root, "p1", seq, seq)

    catalog = CountingCatalog()
    waker = LandingDirectorySource(str(root)).with_catalog(catalog)
    prev = {"p0": [0, 3], "p1": [0, 3]}
    assert waker.initialize_transaction(2, prev) is None  # nothing known: asked, then listed
    assert catalog.partition_reads == 1
    assert [waker.initialize_transaction(t, prev) for t in (3, 4, 5)] == [None, None, None]
    assert catalog.partition_reads == 2  # once more: the first answer predates the listings it made
    os.utime(root / "p1", ns=(time.time_ns(), time.time_ns()))  # p1's folder changed
    assert waker.initialize_transaction(6, prev) is None and catalog.partition_reads == 3
    assert fresh(waker).initialize_transaction(7, prev) is None and catalog.partition_reads == 4
