"""Metadata JSON round-trip rules (STORM-2675) and the offset-range helper."""

from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_txn_provider.rules.exceptions import UnreadableMetadataError
from airflow_txn_provider.rules.sources import next_offset_ranges, validate_metadata

no_nul = st.characters(blacklist_characters="\x00")  # JSONB cannot store it: refused
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(no_nul),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(no_nul, max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_json_values_round_trip(value):
    assert validate_metadata(value, pipeline="p", txid=1, attempt=1) == value


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({"p0": (0, 10)}, "tuple"),
        ({0: [0, 10]}, "key 0 of type int"),
        ({"x": float("nan")}, "not finite"),
        ({"x": float("inf")}, "not finite"),
        ({"at": datetime.date(2026, 1, 1)}, "date"),
        ({"x": decimal.Decimal("1.5")}, "Decimal"),
        ({"x": {1, 2}}, "set"),
        ({"x": b"raw"}, "bytes"),
    ],
)
def test_metadata_that_changes_through_json_is_refused(metadata, problem):
    with pytest.raises(UnreadableMetadataError, match=problem) as err:
        validate_metadata(metadata, pipeline="orders", txid=7, attempt=2)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("orders", 7, 2)
    assert "pipeline=orders txid=7 attempt=2" in str(err.value)


def test_offset_ranges_continue_where_previous_ended():
    first = next_offset_ranges(None, {"a": 25, "b": 5}, max_per_partition=10)
    assert first == {"a": [0, 10], "b": [0, 5]}
    second = next_offset_ranges(first, {"a": 25, "b": 5}, max_per_partition=10)
    assert second == {"a": [10, 20], "b": [5, 5]}


def test_missing_partition_keeps_its_position():
    prev = {"a": [0, 10], "b": [0, 10]}
    nxt = next_offset_ranges(prev, {"a": 30}, max_per_partition=10)
    assert nxt == {"a": [10, 20], "b": [10, 10]}
    later = next_offset_ranges(nxt, {"a": 30, "b": 30}, max_per_partition=10)
    assert later == {"a": [20, 30], "b": [10, 20]}


def test_no_new_data_gives_none():
    assert next_offset_ranges({"a": [0, 10]}, {"a": 10}, max_per_partition=10) is None
    with pytest.raises(ValueError):
        next_offset_ranges(None, {"a": 1}, max_per_partition=0)


@given(
    st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 50)), min_size=1, max_size=8)
)
def test_consecutive_ranges_never_overlap_or_skip(snapshots):
    # Each snapshot is what the source sees at one emission (partitions may vanish and return).
    seen: dict[str, int] = {}
    latest: dict[str, int] = {}
    prev = None
    for snap in snapshots:
        for p, n in snap.items():
            latest[p] = max(latest.get(p, 0), n)  # offsets only grow
        available = {p: latest[p] for p in snap}
        ranges = next_offset_ranges(prev, available, max_per_partition=7)
        if ranges is None:
            continue
        for p, (start, end) in ranges.items():
            assert start == seen.get(p, 0)
            assert start <= end <= start + 7
            seen[p] = end
        prev = ranges
