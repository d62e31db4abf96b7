"""A Delta table's txid → version map read through a handle that another writer has since passed
(real delta-rs on disk). delta-rs's ``history()`` numbers commits down from the handle's snapshot
while listing the newer ones too, so such a handle once resolved "as of txid N" to txid N-1's
version: the container stack test caught it, a reader and a committing pipeline side by side."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_txn_provider.sinks import DeltaSink

SCHEMA = pa.schema([("word", pa.string()), ("txid", pa.int64())])


def commit(sink: DeltaSink, txid: int) -> int:
    """One txid's rows, committed as the pipeline's commit does (a Parquet file, then add)."""
    path = f"{sink.table_uri}/txn/{txid}.parquet"
    rows = pa.table({"word": [f"w{txid}", f"v{txid}"], "txid": [txid, txid]}, schema=SCHEMA)
    pq.write_table(rows, path)
    size = Path(path).stat().st_size
    table = sink.open()
    return table.add(
        [(path, size, rows.num_rows)], SCHEMA, pipeline="p", txid=txid, attempt=1, merge_keys=[]
    )


def test_a_handle_behind_other_writers_still_maps_each_txid_to_its_version(tmp_path):
    sink = DeltaSink("words", table_uri=str(tmp_path / "words"))
    (tmp_path / "words" / "txn").mkdir(parents=True)
    recorded = {1: commit(sink, 1)}
    reader = sink.open()
    assert reader.committed_txid("p") == 1  # the reader's handle now holds txid 1's snapshot
    for txid in (2, 3):  # another writer (the live pipeline) commits on
        recorded[txid] = commit(sink, txid)
    assert recorded == {1: 1, 2: 2, 3: 3}  # version 0 created the table
    assert dict(reader.versions("p")) == recorded
    as_of_2 = reader.read(reader.version_as_of("p", 2))
    assert sorted(as_of_2.column("txid").to_pylist()) == [1, 1, 2, 2]
    assert sink.read_as_of("p", 3).num_rows == 6
