"""Bad input refused by construction, without a database (issue 11): metadata and offsets (names:
state/test_backing.py; the poll interval: test_pipeline.py)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError, UnreadableMetadataError
from airflow_txn_provider.rules.sources import next_offset_ranges, validate_metadata
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.landing import LandingDirectorySource

# -- item 5: metadata with NUL --------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {"p0": "a\u0000b"},
        {"a\u0000": [0, 1]},
        ["x", {"y": ["\u0000"]}],
        "\u0000",
    ],
)
def test_metadata_with_nul_is_refused(metadata):
    """JSON accepts ``\\u0000``, Postgres JSONB does not: refuse it at begin, with the txid."""
    with pytest.raises(UnreadableMetadataError, match="NUL") as err:
        validate_metadata(metadata, pipeline="p", txid=3, attempt=2)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 3, 2)


# -- item 4: offsets going backwards ------------------------------------------------------------


def test_offsets_going_backwards_stop_visibly():
    """Clamping ``end = max(end, start)`` said "no new data" forever, then skipped records."""
    with pytest.raises(OffsetsWentBackError) as err:
        next_offset_ranges(
            {"p0": [0, 10], "p1": [5, 20]}, {"p0": 12, "p1": 7}, max_per_partition=100, txid=4
        )
    message = str(err.value)
    assert "partition 'p1'" in message and "20" in message and "7" in message
    assert err.value.txid == 4


def test_offsets_equal_to_the_previous_end_are_no_new_data():
    assert next_offset_ranges({"p0": [0, 10]}, {"p0": 10}, max_per_partition=5) is None


def test_generated_source_tolerates_a_clock_behind_the_previous_batch():
    """Its offsets are a function of the clock: a worker whose clock is behind has no new lines
    yet, which is not a rewritten partition."""
    source = GeneratedTextSource(partitions=1)
    ahead = source.latest_offsets()["p0"] + 10_000
    assert source.initialize_transaction(2, {"p0": [ahead - 5, ahead]}) is None


def test_a_landing_partition_renumbered_from_zero_stops_visibly(tmp_path):
    source = LandingDirectorySource(str(tmp_path))
    (tmp_path / "p0").mkdir()
    (tmp_path / "p0" / "0.jsonl").write_text('{"line": "a"}\n')
    with pytest.raises(OffsetsWentBackError, match="partition 'p0' went back") as err:
        source.initialize_transaction(7, {"p0": [3, 5]})
    assert err.value.txid == 7
