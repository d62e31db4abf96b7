"""What the file sources' tests share: seeds, files aged into the past, a random landing
history, one look at a partition stored in a catalog, and a catalog counting what it is asked."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_txn_provider.sources.catalog import FileCatalog, Look, MemoryCatalog, Partition

SEEDS = [1, 2, 3, 4, 5, 6, 7, 8]
OLD = time.time_ns() - 3600 * 10**9  # an hour ago: old enough for a listing to be trusted


def age(path: Path, tick: int) -> None:
    """Set a distinct modification time in the past (each write gets its own)."""
    os.utime(path, ns=(OLD + tick * 1000, OLD + tick * 1000))


def record(
    catalog: FileCatalog, source: str, partition: str, folders: dict, added: dict, dropped: Any
) -> Partition:
    """Store one look at ``partition`` (its folders, files added and dropped): the partition
    after it."""
    look = Look(dict(folders), dict(added), set(dropped))
    return catalog.record(source, {partition: look})[partition]


def land(root: Path, partition: str, seq: int, tick: int) -> None:
    """File ``seq`` landed in ``partition``'s folder, the folder and file aged to ``tick``."""
    folder = root / partition
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{seq}.jsonl").write_text(json.dumps({"line": f"{partition} {seq}"}) + "\n")
    age(folder / f"{seq}.jsonl", tick)
    age(folder, tick)


class LandingHistory:
    """A landing folder's random history, one step per txid: files landing (``gaps``: at times
    after a hole in the numbering), partitions going offline and back, the consumer deleting
    what the previous batch read."""

    def __init__(
        self, root: Path, rng: random.Random, *, partitions: int, most: int, gaps: bool
    ) -> None:
        self.root, self.rng = root, rng
        self.partitions, self.most, self.gaps = partitions, most, gaps
        self.next: dict[str, int] = {}
        self.tick = 0

    def step(self, prev: dict[str, Any] | None) -> None:
        root, rng = self.root, self.rng
        for _ in range(rng.randrange(self.partitions + 1)):
            self.tick += 1
            p = f"p{rng.randrange(self.partitions)}"
            roll = rng.random()
            if roll < 0.1 and (root / p).exists():  # offline
                (root / p).rename(root / f".{p}.offline")
            elif roll < 0.2 and (root / f".{p}.offline").exists():  # back online
                (root / f".{p}.offline").rename(root / p)
            elif roll < 0.3 and (root / p).exists():  # the consumer deletes what was read
                done = (prev or {}).get(p, [0, 0])[1]
                for f in (root / p).glob("*.jsonl"):
                    if int(f.stem) < done:
                        f.unlink()
                age(root / p, self.tick)
            elif (root / p).exists() or not (root / f".{p}.offline").exists():
                if self.gaps and roll < 0.35:
                    self.next[p] = self.next.get(p, 0) + 2  # a gap in the numbering
                for _ in range(rng.randrange(1, self.most + 1)):
                    land(root, p, self.next.get(p, 0), self.tick)
                    self.next[p] = self.next.get(p, 0) + 1


class CountingCatalog(MemoryCatalog):
    """A catalog in memory that counts its reads of the partitions and notes each names call's
    partitions (sorted)."""

    def __init__(self) -> None:
        super().__init__()
        self.partition_reads = 0
        self.names_asked: list[list[str]] = []

    def partitions(self, source: str) -> dict[str, Partition]:
        self.partition_reads += 1
        return super().partitions(source)

    def names(self, source: str, partitions: Iterable[str]) -> dict[str, list[str]]:
        self.names_asked.append(sorted(partitions))
        return super().names(source, partitions)
