"""Test data for the Spark sources, written without Spark, and its ground truth in plain Python."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

VOCABULARY = [f"w{i}" for i in range(40)] + ["apple", "dog", "man"]


def random_lines(seed: int, count: int, words_per_line: int = 6) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(VOCABULARY, k=words_per_line)) for _ in range(count)]


def word_counts(lines: Iterable[str]) -> Counter[str]:
    """Ground truth of word_count.transform for lines of lower-case words separated by spaces."""
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(line.split())
    return counts


def append_parquet(
    root: Path, partition: str, lines: Sequence[str], *, file_rows: int = 50
) -> None:
    """Append ``lines`` to partition ``p=<partition>`` with offsets continuing the existing ones."""
    directory = root / f"p={partition}"
    directory.mkdir(parents=True, exist_ok=True)
    existing = sorted(directory.glob("*.parquet"))
    start = sum(pq.ParquetFile(f).metadata.num_rows for f in existing)
    for i in range(0, len(lines), file_rows):
        chunk = lines[i : i + file_rows]
        table = pa.table(
            {
                "offset": pa.array(range(start + i, start + i + len(chunk)), pa.int64()),
                "line": pa.array(chunk, pa.string()),
            }
        )
        pq.write_table(table, directory / f"part-{start + i:08d}.parquet")


def parquet_dataset(root: Path, partitions: Mapping[str, Sequence[str]], **kw: int) -> Path:
    for partition, lines in partitions.items():
        append_parquet(root, partition, lines, **kw)
    return root


def lines_in_ranges(partitions: Mapping[str, Sequence[str]], metadata: Mapping) -> list[str]:
    """The lines an offset-range metadata selects (offsets are positions within a partition)."""
    out: list[str] = []
    for p, (a, b) in metadata.items():
        out += list(partitions.get(p, [])[a:b])
    return out


def write_landing_file(root: Path, partition: str, seq: int, lines: Sequence[str]) -> Path:
    """One numbered JSON-lines file, written whole (temporary name, then rename)."""
    directory = root / partition
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{seq}.tmp"
    tmp.write_text("".join(json.dumps({"line": line}) + "\n" for line in lines))
    final = directory / f"{seq:06d}.jsonl"
    tmp.rename(final)
    return final
