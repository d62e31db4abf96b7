"""The simulated landing producers (sources/simulated_landing.py), the landing examples' source,
without a database: once consumed files are deleted, a producer keeps numbering after the files
it landed, never from 0 again (issue 11). Imported, as before, from the examples' helper
(dags/txn_examples.py)."""

from __future__ import annotations

import functools

from airflow_txn_provider.sources.landing import LandingDirectorySource
from txn_examples import SimulatedLandingSource


def test_landing_producer_never_renumbers_after_consumed_files_are_deleted(tmp_path):
    """It numbered from max(files present) + 1: from 0 again once consumed files were deleted,
    files the source had gone past, so never read."""
    source = SimulatedLandingSource(str(tmp_path), partitions=1, files_per_minute=60)
    begin = functools.partial(LandingDirectorySource.initialize_transaction, source)  # no produce
    started = 1000.0
    source.produce(now=started)
    source.produce(now=started + 3)  # files 0..3
    first = begin(1, None)
    assert first == {"p0": [0, 4]}
    for f in (tmp_path / "p0").glob("*.jsonl"):  # the consumer cleans up what it read
        f.unlink()
    assert begin(2, first) is None  # an empty folder: nothing new, and no error
    source.produce(now=started + 5)
    assert sorted(int(f.stem) for f in (tmp_path / "p0").glob("*.jsonl")) == [4, 5]
    assert begin(2, first) == {"p0": [4, 6]}
