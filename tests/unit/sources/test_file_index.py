"""A Parquet source reads each file's footer once per process (until the file changes), and a
begin reads new footers before it takes the pipeline's lock (the per-partition index, appended to
by a begin that finds new files: test_parquet_index.py)."""

from __future__ import annotations

from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import write_offsets


def test_footers_are_read_once_per_file_until_it_changes(tmp_path, footers_read):
    write_offsets(tmp_path / "p=0" / "a.parquet", range(0, 10))
    write_offsets(tmp_path / "p=1" / "b.parquet", range(0, 5))
    source = PartitionedParquetSource(str(tmp_path), 100)
    assert source.latest_offsets() == {"0": 10, "1": 5}
    assert sorted(footers_read) == ["a.parquet", "b.parquet"]

    assert source.latest_offsets() == {"0": 10, "1": 5}
    assert len(footers_read) == 2  # nothing new: no footer read again

    write_offsets(tmp_path / "p=0" / "c.parquet", range(10, 30))
    assert source.latest_offsets() == {"0": 30, "1": 5}
    assert footers_read[2:] == ["c.parquet"]  # only the new file

    write_offsets(tmp_path / "p=1" / "b.parquet", range(0, 7))  # rewritten: another size
    assert source.latest_offsets() == {"0": 30, "1": 7}
    assert footers_read[3:] == ["b.parquet"]


def test_prefetch_fills_the_cache_the_locked_read_uses(tmp_path, footers_read):
    write_offsets(tmp_path / "p=0" / "a.parquet", range(0, 10))
    source = PartitionedParquetSource(str(tmp_path), 4)
    source.prefetch()
    assert footers_read == ["a.parquet"]
    assert source.initialize_transaction(1, None) == {"0": [0, 4]}
    assert footers_read == ["a.parquet"]  # under the lock: a lookup, no footer read
