"""Server sessions a pipeline's txids reuse (spark/connect_sessions.py), on a real Spark Connect
server and a real Postgres: kept from txid to txid, never shared by two live processes, released
after a failed attempt so nothing it left reaches a later txid."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.rules.exceptions import ProcessingError
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.connect_sessions import (
    _SLOT_LOCK_CLASS,
    SLOTS,
    _slot_key,
    leased_slot,
)
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.conftest import wait_until
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts

MARKER = "txn_test_left_by_an_earlier_txid"


class MarkingTransform:
    """A word count that notes whether an earlier txid's temporary view is in its session, then
    leaves one; ``fail_next`` makes the next call fail after leaving it."""

    def __init__(self) -> None:
        self.saw_marker: list[bool] = []
        self.fail_next = False

    def __call__(self, batch):
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        self.saw_marker.append(spark.catalog.tableExists(MARKER))
        spark.createDataFrame([(1,)], "x int").createOrReplaceTempView(MARKER)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected: the transform failed after leaving a view")
        words = batch.select(F.explode(F.split(F.col("line"), r"\s+")).alias("word"))
        return words.where(F.col("word") != "").groupBy("word").agg(F.count("*").alias("delta"))


def _pipeline(txlog, tmp_path, name):
    data = {str(i): random_lines(70 + i, 40) for i in range(2)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / name, data)), 10)
    txlog.register_pipeline(name, source_kind="transactional", max_pending=4)
    state = MapState(name, f"{name}_words", keys={"word": "text"}).create(txlog.engine)
    return data, source, state


def _process_and_commit(txlog, runner, name, source):
    e = txlog.begin_next(name, source)
    runner.run(BatchJob(name, e.txid, e.attempt, source), txlog)
    assert commit_registered(txlog, name, e.txid, e.attempt).applied
    return e


@pytest.fixture
def no_rotation(monkeypatch):
    """Ids rotate every half hour of the wall clock: a test that straddles a boundary (one did,
    at 21:30:00) would see its slot's next id for a reason of the clock's, not of its own."""
    from airflow_txn_provider.spark import connect_sessions

    monkeypatch.setattr(connect_sessions, "ROTATION_SECONDS", 10**9)


def test_txids_reuse_the_slots_session_and_a_failed_attempt_releases_it(
    txlog, tmp_path, connect_server, no_rotation
):
    data, source, state = _pipeline(txlog, tmp_path, "reuse")
    transform = MarkingTransform()
    runner = SparkConnectRunner(transform, url=connect_server.url)
    done = [_process_and_commit(txlog, runner, "reuse", source) for _ in range(2)]
    assert transform.saw_marker == [False, True]  # txid 2 ran in txid 1's server session

    e = txlog.begin_next("reuse", source)
    transform.fail_next = True
    with pytest.raises(ProcessingError, match="injected"):
        runner.run(BatchJob("reuse", e.txid, e.attempt, source), txlog)
    replay = txlog.begin("reuse", e.txid, source)
    assert replay.attempt == e.attempt + 1
    runner.run(BatchJob("reuse", replay.txid, replay.attempt, source), txlog)
    assert commit_registered(txlog, "reuse", replay.txid, replay.attempt).applied
    # The failed attempt's view (and session) are gone: its replay starts in a clean session.
    assert transform.saw_marker == [False, True, True, False]

    lines = [line for x in [*done, replay] for line in lines_in_ranges(data, x.metadata)]
    with txlog.engine.connect() as conn:
        assert {k[0]: v for k, v in state.items(conn).items()} == dict(word_counts(lines))


def test_without_reuse_every_txid_has_a_session_of_its_own(txlog, tmp_path, connect_server):
    _, source, _ = _pipeline(txlog, tmp_path, "own")
    transform = MarkingTransform()
    runner = SparkConnectRunner(transform, url=connect_server.url, reuse_sessions=False)
    for _ in range(2):
        _process_and_commit(txlog, runner, "own", source)
    assert transform.saw_marker == [False, False]


def test_processes_at_once_lease_different_slots_and_a_dead_holder_frees_its_own(engine):
    url = "sc://127.0.0.1:1"
    with leased_slot(engine, "slots", url) as first, leased_slot(engine, "slots", url) as second:
        assert (first.slot, second.slot) == (0, 1)
        assert next(first.session_ids()) != next(second.session_ids())
        with leased_slot(engine, "other", url) as other:
            assert other.slot == 0  # another pipeline's slots are its own
        pid = first._held._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with engine.connect() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            admin.commit()
            # pg_terminate_backend only signals: wait until the backend has exited (and its
            # locks with it), as a killed worker's would by the time anyone looks
            gone = text("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = :p)")

            def exited() -> bool:
                answer = bool(admin.execute(gone, {"p": pid}).scalar())
                admin.commit()  # a new snapshot of pg_stat_activity at each look
                return answer

            wait_until(exited, 30, "the backend to exit")
        # The holder's connection died (a killed worker): its lock, and slot, went with it.
        with leased_slot(engine, "slots", url) as third:
            assert third.slot == 0
        first.release()  # its connection is gone: releasing is quiet and returns nothing held


def test_every_slot_taken_gives_no_slot(engine):
    """With every slot held (here by one other connection), a process gets no slot (a session
    of its own), and the first slot freed is leased again."""
    url = "sc://127.0.0.1:1"
    keys = [_slot_key("full", n) for n in range(SLOTS)]
    with engine.connect() as other:
        for key in keys:
            assert other.execute(text("SELECT pg_try_advisory_lock(:c, :k)"), lock(key)).scalar()
        with leased_slot(engine, "full", url) as none:
            assert none is None
        other.execute(text("SELECT pg_advisory_unlock(:c, :k)"), lock(keys[3]))
        with leased_slot(engine, "full", url) as freed:
            assert freed is not None and freed.slot == 3
        other.execute(text("SELECT pg_advisory_unlock_all()"))


def lock(key):
    return {"c": _SLOT_LOCK_CLASS, "k": key}
