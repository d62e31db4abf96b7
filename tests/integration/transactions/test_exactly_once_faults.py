"""Exactly once through the faults that used to commit a wrong batch (issue 24), each caused for
real on a real Postgres (a backend SIGKILLed: crash recovery while the server stays up) and real
Delta / Iceberg tables; each test failed on the main before the fix.

1. Crash recovery empties the UNLOGGED staging tables: a txid staged by several jobs replays
   instead of committing empty, and so does a single-job txid.
2. A commit that failed after one lake table's commit: the replay (an opaque source that took
   more records meanwhile) replaces that table's rows of the txid, so both tables agree.
3. A processing task that fails after its output was recorded keeps the output: it commits.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.exceptions import LakeSchemaMismatchError, StagedOutputMismatchError
from airflow_txn_provider.rules.sources import OpaqueSource, TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks import DeltaSink, IcebergSink
from airflow_txn_provider.sinks.base import list_staged
from airflow_txn_provider.state import GlobalState, MapState
from airflow_txn_provider.transactions.commit import (
    commit_registered,
    commit_states,
    record_processed,
)
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from txn_testing.postgres import EmbeddedPostgres


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


class GrowingLog(OpaqueSource):
    """An opaque source over records 0, 1, 2, …: a txid takes every record available from where
    the previous txid ended, so a replay after more arrived takes more."""

    def __init__(self, available: int) -> None:
        self.available = available

    def initialize_transaction(self, txid, prev_metadata):
        start = prev_metadata["end"] if prev_metadata else 0
        return {"start": start, "end": self.available} if self.available > start else None


@pytest.fixture
def crashing_pg():
    """A Postgres of the test's own (a backend kill resets every connection of the server)."""
    with EmbeddedPostgres(durable=True) as pg:  # committed rows survive crash recovery
        yield pg


def _log(pg):
    return TransactionLog(create_engine(pg.url, pool_pre_ping=True))


# -- 1. crash recovery empties staging --------------------------------------------------------


@pytest.mark.parametrize("kill_at", ["after both jobs", "between the jobs"])
def test_a_backend_killed_after_staging_replays_a_multi_job_txid(crashing_pg, kill_at):
    txlog = _log(crashing_pg)
    txlog.register_pipeline("jobs", source_kind="transactional", max_pending=2)
    words = MapState("jobs", "jobs_w", keys={"word": "text"}).create(txlog.engine)
    total = GlobalState("jobs", "jobs_t").create(txlog.engine)
    a = txlog.begin("jobs", 1, Batches()).attempt
    jobs = {
        "a": lambda c, at: {words.output_key: words.stage(c, 1, at, [("x", 1), ("y", 2)], job="a")},
        "b": lambda c, at: {total.output_key: total.stage(c, 1, at, [(3,)], job="b")},
    }

    def run(job, attempt):
        assert txlog.stage("jobs", 1, attempt, lambda c: jobs[job](c, attempt), job=job)

    run("a", a)
    if kill_at == "between the jobs":
        crashing_pg.kill_backend()
    run("b", a)
    if kill_at == "after both jobs":
        crashing_pg.kill_backend()
    with pytest.raises(StagedOutputMismatchError, match="UNLOGGED") as err:
        record_processed(txlog, "jobs", 1, a)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("jobs", 1, a)
    assert txlog.transaction("jobs", 1).status is TxStatus.FAILED
    assert txlog.last_committed("jobs") == 0
    # The source replays the txid: it commits whole.
    b = txlog.begin("jobs", 1, Batches()).attempt
    assert b == a + 1
    run("a", b)
    run("b", b)
    assert record_processed(txlog, "jobs", 1, b) == "accept"
    commit_states(txlog, "jobs", 1, b, [words, total])
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("x",): 1, ("y",): 2}
        assert total.value(conn) == 3
    txlog.engine.dispose()


def test_a_backend_killed_between_processed_and_commit_replays_a_single_job_txid(crashing_pg):
    txlog = _log(crashing_pg)
    txlog.register_pipeline("one", source_kind="transactional", max_pending=2)
    words = MapState("one", "one_w", keys={"word": "text"}).create(txlog.engine)
    a = txlog.begin("one", 1, Batches()).attempt
    txlog.stage_output(
        "one", 1, a, lambda c: {words.output_key: words.stage(c, 1, a, [("x", 1), ("y", 1)])}
    )
    crashing_pg.kill_backend()
    with pytest.raises(
        StagedOutputMismatchError, match="0 staged rows found, the attempt recorded 2"
    ):
        commit_states(txlog, "one", 1, a, [words])
    assert txlog.transaction("one", 1).status is TxStatus.FAILED
    assert txlog.last_committed("one") == 0
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {}
    txlog.engine.dispose()


# -- 2. a partial lake commit -----------------------------------------------------------------


def _sink(kind, tmp_path, name):
    if kind == "delta":
        return DeltaSink(name, table_uri=str(tmp_path / "lake" / name))
    return IcebergSink(name, table=f"eo.{name}", warehouse=str(tmp_path / "warehouse"))


def _stage_files(sink, pipeline, txid, attempt, table):
    """What a job's executors leave for ``sink``: Parquet files and ``_SUCCESS`` in the
    attempt's own directory, listed as the job records them."""
    directory = sink.stage_dir(pipeline, txid, attempt, uuid.uuid4().hex[:8])
    Path(directory).mkdir(parents=True)
    pq.write_table(table, f"{directory}/part-0.parquet")
    Path(directory, "_SUCCESS").touch()
    return list_staged(directory)


def _records(metadata, *, as_text=False):
    values = list(range(metadata["start"], metadata["end"]))
    if as_text:
        return pa.table({"rec": pa.array([str(v) for v in values], pa.string())})
    return pa.table({"rec": pa.array(values, pa.int64())})


def _rows(sink, db_url, pipeline):
    table = sink.open(db_url)
    return sorted(r["rec"] for r in table.read(table.version_as_of(pipeline, 10**9)).to_pylist())


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_commit_failing_after_one_table_replays_into_both_tables_alike(
    kind, txlog, db_url, tmp_path
):
    """Table a commits, table b refuses the batch (a schema mismatch): the txid fails, and its
    replay takes 12 records where the failed attempt had 10. Both tables must hold 0..11."""
    a_sink, b_sink = _sink(kind, tmp_path, "a"), _sink(kind, tmp_path, "b")
    sinks = [a_sink, b_sink]
    source = GrowingLog(10)
    txlog.register_pipeline("two", source_kind="opaque", max_pending=2)

    def process(em, *, bad_b=False):
        staged = {
            a_sink.output_key: _stage_files(
                a_sink, "two", em.txid, em.attempt, _records(em.metadata)
            ),
            b_sink.output_key: _stage_files(
                b_sink, "two", em.txid, em.attempt, _records(em.metadata, as_text=bad_b)
            ),
        }
        txlog.stage_output(
            "two", em.txid, em.attempt, lambda c: {k: v.to_json() for k, v in staged.items()}
        )

    # Table b exists already, with integer records: the first attempt's text records mismatch.
    first = txlog.begin("two", 1, source)
    assert first.metadata == {"start": 0, "end": 10}
    b_table = b_sink.open(db_url)
    setup = _stage_files(b_sink, "setup", 1, 1, pa.table({"rec": pa.array([], pa.int64())}))
    b_table.add(
        [(p, s, r) for p, (_, s, r) in zip(setup.paths(), setup.files, strict=True)],
        pa.schema([("rec", pa.int64())]),
        pipeline="setup",
        txid=1,
        attempt=1,
        merge_keys=(),
    )
    process(first, bad_b=True)
    with pytest.raises(LakeSchemaMismatchError):
        commit_registered(txlog, "two", 1, first.attempt, sinks)
    assert txlog.transaction("two", 1).status is TxStatus.FAILED
    assert _rows(a_sink, db_url, "two") == list(range(10))  # table a took the failed attempt

    source.available = 12  # more arrived: the opaque replay takes it
    second = txlog.begin("two", 1, source)
    assert second.metadata == {"start": 0, "end": 12}
    process(second)
    result = commit_registered(txlog, "two", 1, second.attempt, sinks)
    assert result.details[a_sink.output_key]["action"] == "replace"
    assert result.details[b_sink.output_key]["action"] == "add"
    assert _rows(a_sink, db_url, "two") == list(range(12))
    assert _rows(b_sink, db_url, "two") == list(range(12))
    for sink in sinks:
        table = sink.open(db_url)
        assert table.committed_txid("two") == 1
        assert table.committed_attempt("two", 1) == second.attempt

    # The next txid starts where the committed one ended, and a rerun of its commit is a no-op.
    source.available = 15
    third = txlog.begin("two", 2, source)
    assert third.metadata == {"start": 12, "end": 15}
    process(third)
    assert commit_registered(txlog, "two", 2, third.attempt, sinks).applied
    assert not commit_registered(txlog, "two", 2, third.attempt, sinks).applied
    for sink in sinks:
        assert _rows(sink, db_url, "two") == list(range(15))
        assert [t for t, _ in sink.open(db_url).versions("two")] == [1, 2]
        assert Counter(_rows(sink, db_url, "two")).most_common(1)[0][1] == 1


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_rewind_refuses_to_undo_another_writers_commit(kind, txlog, db_url, tmp_path):
    from airflow_txn_provider.rules.exceptions import LakeTableOutOfSyncError

    sink = _sink(kind, tmp_path, "shared")
    table = sink.open(db_url)
    schema = pa.schema([("rec", pa.int64())])
    for pipeline, txid in (("p", 1), ("p", 2), ("other", 1)):
        files = _stage_files(sink, pipeline, txid, 1, pa.table({"rec": [txid]}, schema=schema))
        table = sink.open(db_url)
        table.add(
            [(p, s, r) for p, (_, s, r) in zip(files.paths(), files.files, strict=True)],
            schema,
            pipeline=pipeline,
            txid=txid,
            attempt=1,
            merge_keys=(),
        )
    with pytest.raises(LakeTableOutOfSyncError, match="another writer"):
        sink.open(db_url).rewind("p", 1)
    assert sorted(
        r["rec"]
        for r in sink.open(db_url).read(sink.open(db_url).version_as_of("other", 1)).to_pylist()
    ) == [1, 1, 2]


# -- 3. a processed attempt keeps its output ----------------------------------------------------


def test_a_processing_failure_reported_after_the_output_was_recorded_fails_nothing(txlog):
    txlog.register_pipeline("late", source_kind="transactional", max_pending=3)
    words = MapState("late", "late_w", keys={"word": "text"}).create(txlog.engine)
    ems = [txlog.begin("late", t, Batches()) for t in (1, 2)]
    a = ems[0].attempt
    txlog.stage_output("late", 1, a, lambda c: {words.output_key: words.stage(c, 1, a, [("x", 1)])})
    # spark-submit exits non-zero at shutdown, or the task's failure callback runs: too late.
    assert txlog.fail("late", 1, a, error="spark-submit exited 1", of_processing=True) == ()
    assert txlog.transaction("late", 1).status is TxStatus.PROCESSED
    assert txlog.transaction("late", 2).status is TxStatus.PROCESSING
    assert txlog.attempts("late", 1)[-1].error is None  # nothing counts toward poison
    assert commit_states(txlog, "late", 1, a, [words]).applied
    # A processing failure of a txid still processing fails it and the later ones, as before.
    assert txlog.fail("late", 2, ems[1].attempt, error="boom", of_processing=True) == (2,)
    # A failed commit (or a cascade) still fails a processed txid.
    b = txlog.begin("late", 2, Batches()).attempt
    txlog.stage_output("late", 2, b, lambda c: {words.output_key: 5})  # 5 recorded, 0 staged
    with pytest.raises(StagedOutputMismatchError):
        commit_states(txlog, "late", 2, b, [words])
    assert txlog.transaction("late", 2).status is TxStatus.FAILED


def test_a_reemit_waits_for_a_staging_that_holds_the_txid_past_its_lease(txlog):
    """Begin re-emits an attempt whose lease ran out; a staging holding the txid's row lock
    (its COPY) past the lease records the output first: begin must then resume, not re-emit."""
    import threading
    import time

    txlog.register_pipeline("slow", source_kind="transactional", max_pending=2)
    words = MapState("slow", "slow_w", keys={"word": "text"}).create(txlog.engine)
    a = txlog.begin("slow", 1, Batches(), claim_timeout=0.5).attempt
    started, release = threading.Event(), threading.Event()

    def slow_stage(c):
        rows = words.stage(c, 1, a, [("x", 1)])
        started.set()
        release.wait(10)  # the COPY takes long; the lease runs out meanwhile
        return {words.output_key: rows}

    stager = threading.Thread(target=lambda: txlog.stage_output("slow", 1, a, slow_stage))
    stager.start()
    assert started.wait(10)
    time.sleep(1.0)  # the lease (0.5 s) is gone by the database's clock
    result: list = []
    begin = threading.Thread(target=lambda: result.append(txlog.begin("slow", 1, Batches())))
    begin.start()
    time.sleep(0.5)
    release.set()
    stager.join(10)
    begin.join(10)
    assert result and result[0].action.value == "resume" and result[0].attempt == a
    assert txlog.transaction("slow", 1).status is TxStatus.PROCESSED
    with txlog.engine.connect() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM txn_attempt WHERE pipeline = 'slow'")).scalar()
            == 1
        )
