"""What the file sources' unit tests share: a new task process's empty caches, files aged into
the past, Parquet files of given offsets."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_txn_provider.sources import file_index, parquet_index

SEEDS = [1, 2, 3, 4, 5, 6, 7, 8]
OLD = time.time_ns() - 3600 * 10**9  # an hour ago: old enough for the index to keep


def new_process() -> None:
    """What a new task process starts with: no footer read, no index loaded, no prefetch."""
    file_index.file_offsets.cache_clear()
    file_index.loaded_indexes.clear()
    parquet_index.loaded_partitions.clear()
    file_index.prefetched.clear()


def age(path: Path, tick: int) -> None:
    """Set a distinct modification time in the past (each write gets its own)."""
    os.utime(path, ns=(OLD + tick * 1000, OLD + tick * 1000))


def write_offsets(path: Path, offsets: list[int] | range) -> None:
    """A Parquet file of ``offsets`` (column ``offset``) with a line each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"offset": pa.array(offsets, pa.int64()), "line": ["x"] * len(offsets)})
    pq.write_table(table, path)
