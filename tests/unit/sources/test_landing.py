"""A begin's cost does not grow with the landing folder's history (sources/landing.py): the
source looks up the files after where the previous batch ended instead of listing every file ever
landed, and gives exactly what a full listing gives; a partition missing, unreadable or
renumbered is handled as before."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError
from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources.landing import LandingDirectorySource
from tests.unit.sources.files_given import SEEDS, age, new_process


def land(root: Path, partition: str, seq: int, tick: int) -> None:
    folder = root / partition
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{seq}.jsonl").write_text(json.dumps({"line": f"{partition} {seq}"}) + "\n")
    age(folder / f"{seq}.jsonl", tick)
    age(folder, tick)


@pytest.mark.parametrize("seed", SEEDS)
def test_landing_probe_gives_the_full_listings_batches(tmp_path, seed, monkeypatch):
    """Consecutive numbering, partitions appearing, going offline and back, consumed files
    deleted, idle partitions: every begin's batch is the one the full listing gave."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "landing"
    root.mkdir()
    source = LandingDirectorySource(str(root), max_files_per_partition=3, index_dir=str(tmp_path))
    nxt: dict[str, int] = {}
    tick = 0
    prev = None
    for txid in range(1, 60):
        for _ in range(rng.randrange(5)):
            tick += 1
            p = f"p{rng.randrange(4)}"
            action = rng.random()
            if action < 0.1 and (root / p).exists():  # offline
                (root / p).rename(root / f".{p}.offline")
            elif action < 0.2 and (root / f".{p}.offline").exists():  # back online
                (root / f".{p}.offline").rename(root / p)
            elif action < 0.3 and (root / p).exists():  # the consumer deletes what was read
                done = (prev or {}).get(p, [0, 0])[1]
                for f in (root / p).glob("*.jsonl"):
                    if int(f.stem) < done:
                        f.unlink()
                age(root / p, tick)
            elif (root / p).exists() or not (root / f".{p}.offline").exists():
                for _ in range(rng.randrange(1, 6)):
                    land(root, p, nxt.get(p, 0), tick)
                    nxt[p] = nxt.get(p, 0) + 1
        new_process()
        expected = next_offset_ranges(prev, source.latest_offsets(), max_per_partition=3)
        assert source.initialize_transaction(txid, prev) == expected, f"seed {seed} txid {txid}"
        prev = expected or prev


def test_landing_partition_with_new_files_is_not_listed(tmp_path, monkeypatch):
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
    new_process()
    assert source.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 1]}
    assert listed == ["p1"]  # p0 looked up by number; p1 has nothing new: listed once
    listed.clear()
    new_process()
    assert source.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 1]}
    assert listed == []  # p1's folder unchanged: the index says it ends at 0
    land(root, "p1", 5, 99)  # a gap in p1's numbering: its folder changed, listed again
    new_process()
    assert source.initialize_transaction(9, prev) == {"p0": [48, 50], "p1": [1, 5]}
    assert listed == ["p1"]


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
    for _ in range(2):  # listed, then from the index: the same answer
        new_process()
        assert source.initialize_transaction(4, {"p0": [3, 5]}) is None
    land(root, "p0", 0, 1)  # numbering from 0 again
    for _ in range(2):
        new_process()
        with pytest.raises(OffsetsWentBackError, match="partition 'p0' went back"):
            source.initialize_transaction(4, {"p0": [3, 5]})


def test_a_corrupt_landing_index_is_rebuilt(tmp_path):
    root = tmp_path / "landing"
    for seq in range(3):
        land(root, "p0", seq, seq)
    source = LandingDirectorySource(str(root), index_dir=str(tmp_path / "ix"))
    assert source.initialize_transaction(2, {"p0": [0, 3]}) is None
    (index,) = (tmp_path / "ix").glob("landing-*.json")
    data = json.loads(index.read_text())
    assert data["entries"]["p0"][2] == 2
    data["entries"]["p0"][2] = 7  # a wrong answer, with another folder time: not believed
    data["entries"]["p0"][0] += 1
    index.write_text(json.dumps(data))
    new_process()
    assert source.initialize_transaction(2, {"p0": [0, 3]}) is None
    index.write_text("{garbage")
    new_process()
    assert source.initialize_transaction(2, {"p0": [0, 3]}) is None
    assert json.loads(index.read_text())["entries"]["p0"][2] == 2
