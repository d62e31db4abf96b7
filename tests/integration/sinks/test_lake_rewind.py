"""Rewind to txid N with lake tables, on real components: a real Delta table (delta-rs) and a
real Iceberg table (pyiceberg, SQL catalog in the test's Postgres), each with an append sink and
a merge sink, beside a Postgres state.

After a rewind every table reads exactly as after txid N - 1, and after the txids recompute with
a changed transform, as ground truth computed in plain Python: the old transform before N, the
new one from N. A crash between the log's rewind and the tables' is a rewind whose table step
never ran: the next commit into each table rolls it back first. Seeds are printed.

The batches are staged as a processing job stages them (Parquet files in the attempt's own
directory, recorded with its output), written here with pyarrow: Spark's part is tested in
``test_lake_tables.py``.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.sinks import DeltaSink, IcebergSink, list_staged
from airflow_txn_provider.state import MapState, load_states, stage_states
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.rewind import LogRewind
from tests.integration.transactions.test_rewind import Ranges, new_transform, old_transform, records

pytestmark = pytest.mark.integration


def sinks(kind, tmp_path):
    if kind == "delta":
        return (
            DeltaSink("events", table_uri=str(tmp_path / "lake" / "events"), txid_column="txid"),
            DeltaSink(
                "totals", table_uri=str(tmp_path / "lake" / "totals"), mode="merge", keys=["word"]
            ),
        )
    warehouse = str(tmp_path / "warehouse")
    return (
        IcebergSink("events", table="lake.events", warehouse=warehouse, txid_column="txid"),
        IcebergSink(
            "totals", table="lake.totals", warehouse=warehouse, mode="merge", keys=["word"]
        ),
    )


def run_txid(txlog, name, txid, source, transform, lake, *, commit=True):
    """Begin ``txid``, stage its counts into the Postgres state and as Parquet for each sink (as
    a processing job does), and commit it with the sinks; returns its emission."""
    e = txlog.begin(name, txid, source)
    assert e.emitted, e
    counts = transform(records(e.metadata["start"], e.metadata["end"]))
    words = pa.table({"word": list(counts), "n": [int(v) for v in counts.values()]})
    staged = {}
    for sink in lake:
        batch = words
        directory = sink.stage_dir(name, txid, e.attempt, "test")
        local = Path(directory.removeprefix("file://"))
        local.mkdir(parents=True)
        if sink.txid_column:  # the job adds it to every row
            batch = batch.append_column(sink.txid_column, pa.array([txid] * len(batch)))
        pq.write_table(batch, local / "part-0.parquet")
        (local / "_SUCCESS").touch()
        staged[sink.output_key] = list_staged(directory).to_json()
    state = load_states(txlog.engine, name)[f"{name}_tx"]

    def stage(conn):
        return {**stage_states(conn, txid, e.attempt, {state: list(counts.items())}), **staged}

    txlog.stage_output(name, txid, e.attempt, stage)
    if commit:
        assert commit_registered(txlog, name, txid, e.attempt, lake).applied
    return e


def table_now(sink, db_url):
    """The table's rows as readers see them now (its current version)."""
    table = sink.open(db_url)
    return rows_of(sink, table.read(table.version_as_of("p", 10**9)))


def table_as_of(sink, db_url, txid):
    return rows_of(sink, sink.open(db_url).read(sink.open(db_url).version_as_of("p", txid)))


def rows_of(sink, arrow):
    rows = arrow.to_pylist()
    if sink.mode == "merge":
        return Counter({(r["word"], r["n"]): 1 for r in rows})
    return Counter((r["txid"], r["word"], r["n"]) for r in rows)


def truth(sink, ranges, transform_of, through):
    """What ``sink``'s table holds after txid ``through``: every txid's rows (append), or the
    newest txid's count of each word (merge)."""
    if sink.mode == "append":
        return Counter(
            (t, w, n)
            for t, (s, e) in ranges.items()
            if t <= through
            for w, n in transform_of(t)(records(s, e)).items()
        )
    latest: dict[str, int] = {}
    for t in sorted(ranges):
        if t <= through:
            latest.update(transform_of(t)(records(*ranges[t])))
    return Counter({(w, n): 1 for w, n in latest.items()})


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_rewind_takes_every_lake_table_back_to_n_minus_1_and_recomputes_with_the_new_job(
    kind, txlog, db_url, tmp_path, monkeypatch
):
    seed = 2911 + (kind == "iceberg")
    rng = random.Random(seed)
    print(f"seed {seed}")
    name = "p"
    lake = sinks(kind, tmp_path)
    txlog.register_pipeline(name, source_kind="transactional", max_pending=4)
    MapState(name, f"{name}_tx", "transactional", keys={"word": "text"}).create(txlog.engine)
    source = Ranges()
    last = 8
    ranges = {}
    for txid in range(1, last + 1):
        e = run_txid(txlog, name, txid, source, old_transform, lake)
        ranges[txid] = (e.metadata["start"], e.metadata["end"])
    # txid 9 processed, waiting to commit: its files are staged, never in a table
    run_txid(txlog, name, last + 1, source, old_transform, lake, commit=False)
    old = {t: old_transform for t in range(1, last + 2)}
    n = rng.randrange(2, last)
    print(f"rewind to txid {n}")

    result = txlog.rewind(name, n, by="test:carol")
    assert set(result.tables) == {"events", "totals"}
    assert all(f"rolled back to txid {n - 1}" in what for what in result.tables.values())
    for sink in lake:
        assert sink.open(db_url).committed_txid(name) == n - 1
        assert table_now(sink, db_url) == truth(sink, ranges, old.get, n - 1), sink.name
    assert txlog.follow_lake_tables(name) == {
        "events": f"at txid {n - 1} already",
        "totals": f"at txid {n - 1} already",
    }  # idempotent

    def transform_of(t):
        return old_transform if t < n else new_transform

    for txid in range(n, last + 2):
        e = run_txid(txlog, name, txid, source, new_transform, lake)
        ranges[txid] = (e.metadata["start"], e.metadata["end"])
    for sink in lake:
        assert table_now(sink, db_url) == truth(sink, ranges, transform_of, last + 1), sink.name
    with txlog.engine.connect() as conn:
        state = load_states(conn, name)[f"{name}_tx"]
        words = {k[0]: v for k, v in state.items(conn).items()}
    expected: Counter[str] = Counter()
    for t, (s, e) in ranges.items():
        expected.update(transform_of(t)(records(s, e)))
    assert words == dict(expected)

    # A crash right after the log's rewind, before its table step: the tables stay ahead, a
    # reader as of the log's last committed txid reads them right, the next commit rolls back.
    m = rng.randrange(n, last + 2)
    print(f"rewind to txid {m}, the table step lost")
    monkeypatch.setattr(LogRewind, "follow_lake_tables", lambda self, pipeline: {})
    txlog.rewind(name, m, by="test:carol")
    monkeypatch.undo()
    for sink in lake:
        assert sink.open(db_url).committed_txid(name) == last + 1  # still ahead
        assert table_as_of(sink, db_url, m - 1) == truth(sink, ranges, transform_of, m - 1)
    for txid in range(m, last + 2):
        e = run_txid(txlog, name, txid, source, old_transform if txid % 2 else new_transform, lake)
        ranges[txid] = (e.metadata["start"], e.metadata["end"])

    def final_transform(t):
        return transform_of(t) if t < m else (old_transform if t % 2 else new_transform)

    for sink in lake:
        assert table_now(sink, db_url) == truth(sink, ranges, final_transform, last + 1), sink.name
        assert sink.open(db_url).committed_txid(name) == last + 1
