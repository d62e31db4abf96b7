"""GeneratedTextSource on a real local Spark: replays are identical, ranges tile, rate holds."""

from __future__ import annotations

import pytest

from airflow_txn_provider.sources.base import source_from_spec
from airflow_txn_provider.sources.generated import (
    DEFAULT_VOCABULARY,
    GENERATED_EPOCH,
    GeneratedTextSource,
)


def rows(spark, source, metadata):
    return sorted(tuple(r) for r in source.read_batch(spark, metadata).collect())


def test_a_batch_reads_the_same_lines_every_time(spark):
    source = GeneratedTextSource(partitions=2, words_per_line=5, seed=7)
    metadata = {"p0": [100, 140], "p1": [7, 9]}
    first = rows(spark, source, metadata)
    again = rows(spark, source_from_spec(source.to_spec()), metadata)
    assert first == again
    assert len(first) == 42
    assert {(p, o) for p, o, _ in first} == {("p0", o) for o in range(100, 140)} | {
        ("p1", 7),
        ("p1", 8),
    }
    for _, _, line in first:
        words = line.split(" ")
        assert len(words) == 5 and set(words) <= set(DEFAULT_VOCABULARY)
    # Different positions and seeds give different text (not one line repeated).
    assert len({line for *_, line in first}) > 30
    other_seed = rows(spark, GeneratedTextSource(partitions=2, words_per_line=5, seed=8), metadata)
    assert [r[2] for r in other_seed] != [r[2] for r in first]


def test_txids_tile_the_generated_lines(monkeypatch):
    source = GeneratedTextSource(lines_per_second=10, max_per_partition=50, partitions=1)
    now = [GENERATED_EPOCH + 1000.0]  # 10_000 lines written so far
    monkeypatch.setattr("time.time", lambda: now[0])
    first = source.initialize_transaction(1, None)
    assert first == {"p0": [9950, 10000]}  # starts at the newest lines, not at the epoch
    assert source.initialize_transaction(2, first) is None  # nothing new yet
    now[0] += 2.5
    second = source.initialize_transaction(2, first)
    assert second == {"p0": [10000, 10025]}
    now[0] += 3600  # a pause: catch up at most max_per_partition at a time
    assert source.initialize_transaction(3, second) == {"p0": [10025, 10075]}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lines_per_second": 0}, "lines_per_second"),
        ({"partitions": 0}, "partitions"),
        ({"vocabulary": ()}, "vocabulary"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GeneratedTextSource(**kwargs)
