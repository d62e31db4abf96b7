"""Exact results under bad input (issue 11), on a real Postgres (and Spark where the path is
Spark's): a bad row is refused naming the txid before anything is staged, never a wrong sum;
several jobs of a txid stage side by side; reserved words and odd names work or are refused
clearly; a batch never commits emptier than its metadata."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.exceptions import (
    MalformedOutputError,
    StagedOutputMismatchError,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import GlobalState, MapState
from airflow_txn_provider.transactions.commit import commit_states, record_processed
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import reader
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts
from txn_testing.postgres import EmbeddedPostgres, postgres_bindir

JOBS = Path(__file__).resolve().parents[3] / "spark_jobs"

KINDS = ["non_transactional", "transactional", "opaque"]


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _begin(txlog, pipeline, txid=1):
    em = txlog.begin(pipeline, txid, Batches())
    assert em.emitted
    return em.attempt


def _stage_and_commit(txlog, pipeline, txid, states_rows):
    attempt = _begin(txlog, pipeline, txid)
    txlog.stage_output(
        pipeline,
        txid,
        attempt,
        lambda c: {s.output_key: s.stage(c, txid, attempt, rows) for s, rows in states_rows},
    )
    commit_states(txlog, pipeline, txid, attempt, [s for s, _ in states_rows])


# -- item 1: None / NaN deltas, empty string keys -----------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_none_delta_is_refused_and_never_wipes_a_sum(txlog, kind):
    """A None delta went in as NULL and value + NULL made the key's total NULL."""
    pipeline = f"none_{kind}"
    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    words = MapState(pipeline, f"{pipeline}_w", kind, keys={"word": "text"}).create(txlog.engine)
    total = GlobalState(pipeline, f"{pipeline}_t", kind).create(txlog.engine)
    _stage_and_commit(txlog, pipeline, 1, [(words, [("a", 5)]), (total, [(5,)])])

    attempt = _begin(txlog, pipeline, 2)
    for state, rows, shown in [
        (words, [("a", 1), ("a", None)], "('a', None)"),
        (total, [(None,)], "(None,)"),
    ]:
        with pytest.raises(MalformedOutputError, match="delta is null") as err:
            txlog.stage_output(
                pipeline,
                2,
                attempt,
                lambda c, s=state, r=rows: {s.output_key: s.stage(c, 2, attempt, r)},
            )
        assert (err.value.pipeline, err.value.txid, err.value.attempt) == (pipeline, 2, attempt)
        assert err.value.state == state.name and err.value.row == shown
        assert shown in str(err.value)
    with txlog.engine.connect() as conn:
        assert words.staged(conn, 2, attempt) == []  # nothing staged
        assert words.items(conn) == {("a",): 5}
        assert total.value(conn) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_string_key_stays_an_empty_string(txlog, kind):
    """csv wrote '' unquoted, which COPY reads as NULL: the commit then failed on NOT NULL."""
    pipeline = f"empty_{kind}"
    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    words = MapState(pipeline, f"{pipeline}_w", kind, keys={"word": "text", "n": "bigint"})
    words.create(txlog.engine)
    _stage_and_commit(txlog, pipeline, 1, [(words, [("", 1, 2), ("", 1, 3), ("x", 1, 1)])])
    _stage_and_commit(txlog, pipeline, 2, [(words, [("", 1, 10)])])
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("", 1): 15, ("x", 1): 1}


def test_a_none_key_is_refused(txlog):
    txlog.register_pipeline("nonekey", source_kind="transactional", max_pending=2)
    words = MapState("nonekey", "nonekey_w", keys={"word": "text"}).create(txlog.engine)
    attempt = _begin(txlog, "nonekey")
    with pytest.raises(MalformedOutputError, match="key word is null") as err:
        txlog.stage_output(
            "nonekey", 1, attempt, lambda c: {"x": words.stage(c, 1, attempt, [(None, 1)])}
        )
    assert err.value.txid == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, Decimal("NaN")])
@pytest.mark.parametrize("value_type", ["double precision", "numeric"])
def test_a_nan_delta_is_refused(txlog, bad, value_type):
    txlog.register_pipeline("nan", source_kind="transactional", max_pending=2)
    name = "nan_" + value_type.split()[0]
    sums = MapState("nan", name, keys={"k": "text"}, value_type=value_type).create(txlog.engine)
    attempt = _begin(txlog, "nan")
    with pytest.raises(MalformedOutputError, match="delta is"):
        txlog.stage_output(
            "nan", 1, attempt, lambda c: {"x": sums.stage(c, 1, attempt, [("a", bad)])}
        )
    with txlog.engine.connect() as conn:
        assert sums.staged(conn, 1, attempt) == []


def test_arrow_staging_refuses_null_and_nan_naming_the_row(txlog):
    """What a Spark job stages: a null or NaN in the Arrow result."""
    txlog.register_pipeline("arrow", source_kind="transactional", max_pending=2)
    counts = MapState("arrow", "arrow_c", keys={"word": "text"}).create(txlog.engine)
    sums = MapState("arrow", "arrow_s", keys={"word": "text"}, value_type="double precision")
    sums.create(txlog.engine)
    attempt = _begin(txlog, "arrow")
    cases = [
        (counts, pa.table({"word": ["a", "b"], "delta": pa.array([1, None], pa.int64())}), "b"),
        (counts, pa.table({"word": ["a", None], "delta": pa.array([1, 2], pa.int64())}), None),
        (sums, pa.table({"word": ["a", "c"], "delta": [1.0, math.nan]}), "c"),
    ]
    for state, table, word in cases:
        with pytest.raises(MalformedOutputError) as err:
            with txlog.engine.begin() as conn:
                state.stage_arrow(conn, 1, attempt, table)
        assert err.value.row is not None and repr(word) in err.value.row
    with txlog.engine.begin() as conn:  # and an empty string key goes through as ''
        table = pa.table({"word": ["", "a"], "delta": pa.array([4, 1], pa.int64())})
        assert counts.stage_arrow(conn, 1, attempt, table) == 2
        assert counts.staged(conn, 1, attempt) == [("", 4), ("a", 1)]


# -- item 2: several jobs per txid stage into the same state ------------------------------------


def test_two_jobs_staging_one_state_keep_both_and_a_rerun_replaces_only_its_own(txlog):
    txlog.register_pipeline("jobs", source_kind="transactional", max_pending=2)
    words = MapState("jobs", "jobs_w", keys={"word": "text"}).create(txlog.engine)
    attempt = _begin(txlog, "jobs")
    for job, rows in [("a", [("x", 1), ("y", 2)]), ("b", [("x", 10)]), ("a", [("x", 1), ("y", 2)])]:
        assert txlog.stage(
            "jobs",
            1,
            attempt,
            lambda c, j=job, r=rows: {words.output_key: words.stage(c, 1, attempt, r, job=j)},
            job=job,
        )
    assert record_processed(txlog, "jobs", 1, attempt) == "accept"
    assert txlog.transaction("jobs", 1).output == {words.output_key: 3}
    commit_states(txlog, "jobs", 1, attempt, [words])
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("x",): 11, ("y",): 2}


def test_a_staging_table_of_an_earlier_version_gains_the_job_column(txlog):
    words = MapState("old", "old_w", keys={"word": "text"}).create(txlog.engine)
    with txlog.engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {words.stage_table} DROP COLUMN stage_job"))
    words.create(txlog.engine)  # what begin does on every txid
    words.create(txlog.engine)
    txlog.register_pipeline("old", source_kind="transactional", max_pending=2)
    attempt = _begin(txlog, "old")
    txlog.stage(
        "old",
        1,
        attempt,
        lambda c: {words.output_key: words.stage(c, 1, attempt, [("x", 1)], job="a")},
        job="a",
    )
    txlog.stage(
        "old",
        1,
        attempt,
        lambda c: {words.output_key: words.stage(c, 1, attempt, [("x", 2)], job="b")},
        job="b",
    )
    assert record_processed(txlog, "old", 1, attempt) == "accept"
    commit_states(txlog, "old", 1, attempt, [words])
    with txlog.engine.connect() as conn:
        assert words.items(conn) == {("x",): 3}


def test_record_processed_counts_every_state_zero_included(txlog):
    txlog.register_pipeline("zero", source_kind="transactional", max_pending=2)
    words = MapState("zero", "zero_w", keys={"word": "text"}).create(txlog.engine)
    total = GlobalState("zero", "zero_t").create(txlog.engine)
    attempt = _begin(txlog, "zero")
    txlog.stage(
        "zero",
        1,
        attempt,
        lambda c: {words.output_key: words.stage(c, 1, attempt, [("x", 1)], job="a")},
        job="a",
    )
    assert record_processed(txlog, "zero", 1, attempt) == "accept"
    assert txlog.transaction("zero", 1).output == {words.output_key: 1, total.output_key: 0}


def _pg_ctl(pg, *args):
    subprocess.run(
        pg._as_server_user([str(postgres_bindir() / "pg_ctl"), "-D", str(pg.datadir), *args]),
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_a_postgres_crash_between_staging_and_record_processed_replays_the_txid():
    """A crash empties UNLOGGED staging tables; record_processed then counted zero rows for
    every state and the txid committed without its data. (A backend killed while the server
    stays up does the same: tests/integration/transactions/test_exactly_once_faults.py.)"""
    with EmbeddedPostgres(durable=True) as pg:  # committed rows survive the crash
        engine = create_engine(pg.url, pool_pre_ping=True)
        txlog = TransactionLog(engine)
        txlog.register_pipeline("crash", source_kind="transactional", max_pending=2)
        words = MapState("crash", "crash_w", keys={"word": "text"}).create(engine)
        total = GlobalState("crash", "crash_t").create(engine)
        attempt = _begin(txlog, "crash")
        txlog.stage(
            "crash",
            1,
            attempt,
            lambda c: {words.output_key: words.stage(c, 1, attempt, [("x", 1)], job="a")},
            job="a",
        )
        txlog.stage(
            "crash",
            1,
            attempt,
            lambda c: {total.output_key: total.stage(c, 1, attempt, [(1,)], job="b")},
            job="b",
        )
        engine.dispose()
        _pg_ctl(pg, "-m", "immediate", "-w", "stop")  # a crash: no shutdown checkpoint
        pg.start()  # same folder and port: crash recovery empties the UNLOGGED tables
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {words.stage_table}")).scalar() == 0
        with pytest.raises(StagedOutputMismatchError, match="UNLOGGED") as err:
            record_processed(txlog, "crash", 1, attempt)
        assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("crash", 1, attempt)
        assert txlog.transaction("crash", 1).status is TxStatus.FAILED  # replays, nothing lost
        with engine.connect() as conn:
            assert words.items(conn) == {} and total.value(conn) is None
        engine.dispose()


# -- item 5: reserved words as key columns ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_reserved_words_as_key_columns_work_end_to_end(txlog, kind):
    """``user``, ``order``, ``offset``, ``end`` passed validation, then a raw syntax error."""
    pipeline = f"reserved_{kind}"
    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
    keys = {"user": "text", "order": "bigint", "offset": "bigint", "end": "text"}
    state = MapState(pipeline, f"{pipeline}_s", kind, keys=keys).create(txlog.engine)
    _stage_and_commit(txlog, pipeline, 1, [(state, [("u", 1, 2, "e", 5), ("u", 1, 2, "e", 1)])])
    attempt = _begin(txlog, pipeline, 2)
    with txlog.engine.begin() as conn:
        state.stage_arrow(
            conn,
            2,
            attempt,
            pa.table({"user": ["u"], "order": [1], "offset": [2], "end": ["e"], "delta": [4]}),
        )
    txlog.mark_processed(pipeline, 2, attempt, {state.output_key: 1})
    commit_states(txlog, pipeline, 2, attempt, [state])
    with txlog.engine.connect() as conn:
        assert state.items(conn) == {("u", 1, 2, "e"): 10}
        assert state.get(conn, [("u", 1, 2, "e"), ("v", 0, 0, "")]) == {("u", 1, 2, "e"): 10}
        assert state.rows(conn)[0]["user"] == "u"
    summary = reader.state_summaries(txlog.engine, pipeline)
    assert "error" not in summary[0], summary


# -- item 3: partition directories Spark would read as numbers ----------------------------------


def _word_count():
    from airflow_txn_provider.operators.spark_runner import load_job_module

    return load_job_module(JOBS / "word_count.py")


def test_zero_padded_partition_directories_are_read_whole(txlog, tmp_path, spark):
    """Spark read ``p=01`` as 1, the filter on "01" matched nothing and the txid committed an
    empty batch (also ``p=1.50`` and ``p=+5``)."""
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob, process_batch
    from airflow_txn_provider.transactions.commit import commit_registered

    data = {"01": random_lines(1, 30), "1.50": random_lines(2, 20), "+5": random_lines(3, 10)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 100)
    txlog.register_pipeline("padded", source_kind="transactional", max_pending=2)
    words = MapState("padded", "padded_w", keys={"word": "text"}).create(txlog.engine)
    e = txlog.begin_next("padded", source)
    assert e.metadata == {"01": [0, 30], "1.50": [0, 20], "+5": [0, 10]}
    outcome = process_batch(
        spark, txlog, BatchJob("padded", 1, e.attempt, source), _word_count().transform
    )
    assert outcome.status == "processed"
    commit_registered(txlog, "padded", 1, e.attempt)
    with txlog.engine.connect() as conn:
        committed = {k[0]: v for k, v in words.items(conn).items()}
    assert committed == dict(word_counts(lines_in_ranges(data, e.metadata)))
    batch = source.read_batch(spark, e.metadata)
    assert sorted(r[0] for r in batch.select("p").distinct().collect()) == ["+5", "01", "1.50"]


def test_one_scan_labels_each_row_with_its_partition_exactly(tmp_path, any_session):
    """A batch is one scan of its files, each row labelled by the file it came from: names a URI
    escapes (``a b``, ``5%``, ``x#y``), a padded one, and partitions at different offsets read the
    same rows as a scan per partition, each row under its own partition."""
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    data = {
        "a b": random_lines(4, 30),
        "5%": random_lines(5, 12),
        "x#y": random_lines(6, 7),
        "01": random_lines(7, 40),
    }
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data, file_rows=8)), 10)
    metadata = {"a b": [10, 20], "5%": [0, 10], "x#y": [0, 7], "01": [25, 35]}

    def rows(batch):
        return sorted((r["p"], r["offset"], r["line"]) for r in batch.collect())

    expected = sorted(
        (p, offset, data[p][offset]) for p, (a, b) in metadata.items() for offset in range(a, b)
    )
    assert rows(source.read_batch(any_session, metadata)) == expected
    ranges = {p: (a, b) for p, (a, b) in metadata.items()}
    files = {p: source._files_holding(source.path, p, a, b) for p, (a, b) in ranges.items()}
    assert len(files["01"]) == 2  # offsets 25..34 span two files of 8 rows: only those are read
    assert rows(source._read_by_partition(any_session, files, ranges)) == expected


def test_partition_values_come_from_their_directories_when_spark_reads_them_back(
    tmp_path, any_session
):
    """Where Spark's partition discovery reads a directory's value back exactly (no ``%``
    escape), the scan takes each row's partition from its directory, as a string (``01`` stays
    ``01``), with no lookup per row; the rows equal the metadata's, partitions at different
    offsets included. A batch with a ``%`` name is labelled by file instead, as exactly."""
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.sources.parquet_read import read_with_partition_column

    data = {
        "01": random_lines(8, 40),
        "1.50": random_lines(9, 12),
        "+5": random_lines(10, 9),
        "a b": random_lines(11, 30),
        "x#y": random_lines(12, 7),
    }
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data, file_rows=8)), 10)
    metadata = {"01": [25, 35], "1.50": [0, 10], "+5": [2, 9], "a b": [10, 20], "x#y": [0, 7]}
    files = {p: source._files_holding(source.path, p, a, b) for p, (a, b) in metadata.items()}
    assert read_with_partition_column(any_session, source.path, "p", files) is not None
    expected = sorted(
        (p, offset, data[p][offset]) for p, (a, b) in metadata.items() for offset in range(a, b)
    )
    with pytest.MonkeyPatch.context() as one_scan:  # no scan per partition: one reads them back

        def scan_per_partition(*_: object) -> None:
            raise AssertionError("a scan per partition where one scan reads the values back")

        one_scan.setattr(PartitionedParquetSource, "_read_by_partition", scan_per_partition)
        batch = source.read_batch(any_session, metadata)
    assert sorted((r["p"], r["offset"], r["line"]) for r in batch.collect()) == expected
    counts = source.batch_counts(metadata)
    found = batch.agg(*[c.alias(n) for n, c in counts.items()]).collect()[0].asDict()
    assert source.counts_mismatch(found, metadata) is None
    # the files' columns declared (no footer read): the same rows, the partition a string still
    declared = dataclasses.replace(source, schema="offset BIGINT, line STRING")
    batch = declared.read_batch(any_session, metadata)
    assert sorted((r["p"], r["offset"], r["line"]) for r in batch.collect()) == expected
    assert dict(batch.dtypes)["p"] == "string"

    escaped = {"5%": random_lines(13, 5), "01": random_lines(14, 5)}
    other = PartitionedParquetSource(str(parquet_dataset(tmp_path / "esc", escaped)), 10)
    meta = {"5%": [0, 5], "01": [0, 5]}
    held = {p: other._files_holding(other.path, p, a, b) for p, (a, b) in meta.items()}
    assert read_with_partition_column(any_session, other.path, "p", held) is None
    got = sorted((r["p"], r["offset"]) for r in other.read_batch(any_session, meta).collect())
    assert got == sorted((p, o) for p in meta for o in range(5))


@pytest.fixture(params=["classic", "connect"])
def any_session(request):
    """A classic session (the completeness counts in a pass of their own) or a Spark Connect
    one (counted while the transform runs, ``DataFrame.observe``)."""
    if request.param == "classic":
        yield request.getfixturevalue("spark")
        return
    from pyspark.sql import SparkSession

    from airflow_txn_provider.spark.connect_sessions import keep_classic_mode

    with keep_classic_mode():
        session = SparkSession.builder.remote(
            request.getfixturevalue("connect_server").url
        ).create()
        yield session
        session.stop()


def _ignores_its_batch(batch):
    """A transform that never reads the batch: there is nothing to observe the counts on."""
    return batch.sparkSession.createDataFrame([("x", 1)], "word string, delta long")


@pytest.mark.parametrize("transform", ["word_count", "ignores_its_batch"])
def test_a_batch_that_reads_fewer_records_than_its_metadata_fails_the_txid(
    txlog, tmp_path, any_session, transform
):
    from airflow_txn_provider.rules.exceptions import IncompleteBatchError
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob, process_batch

    data = {"0": random_lines(4, 100), "1": random_lines(5, 20)}
    root = parquet_dataset(tmp_path / "ds", data)
    source = PartitionedParquetSource(str(root), 100)
    txlog.register_pipeline("short", source_kind="transactional", max_pending=2)
    MapState("short", "short_w", keys={"word": "text"}).create(txlog.engine)
    e = txlog.begin_next("short", source)
    assert e.metadata == {"0": [0, 100], "1": [0, 20]}
    (root / "p=0" / "part-00000050.parquet").unlink()  # 50 records gone after begin
    with pytest.raises(
        IncompleteBatchError,
        match=r"partition '0' offsets \[0, 100\): 50 records read, 100 expected",
    ) as err:
        process_batch(
            any_session,
            txlog,
            BatchJob("short", 1, e.attempt, source),
            _word_count().transform if transform == "word_count" else _ignores_its_batch,
        )
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("short", 1, e.attempt)
    assert txlog.transaction("short", 1).status is TxStatus.FAILED


def test_offsets_written_twice_are_refused_though_the_footers_are_read_first(
    txlog, tmp_path, any_session
):
    """A batch whose files' footers add up to its ranges is whole without a count over its rows;
    one whose files hold more (a file copied under a new name) is counted, and refused."""
    import shutil

    from airflow_txn_provider.rules.exceptions import IncompleteBatchError
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob, process_batch

    data = {"0": random_lines(8, 100), "1": random_lines(9, 20)}
    root = parquet_dataset(tmp_path / "ds", data)
    source = PartitionedParquetSource(str(root), 100)
    source.read_batch(any_session, {"0": [0, 100], "1": [0, 20]})
    assert source.batch_counts({"0": [0, 100], "1": [0, 20]}) is None  # proven by the footers
    txlog.register_pipeline("twice", source_kind="transactional", max_pending=2)
    MapState("twice", "twice_w", keys={"word": "text"}).create(txlog.engine)
    e = txlog.begin_next("twice", source)
    assert e.metadata == {"0": [0, 100], "1": [0, 20]}
    part = root / "p=0" / "part-00000050.parquet"
    shutil.copy(part, part.with_name("part-00000050-copy.parquet"))
    with pytest.raises(
        IncompleteBatchError,
        match=r"partition '0' offsets \[0, 100\): 150 records read, 100 expected",
    ):
        process_batch(
            any_session, txlog, BatchJob("twice", 1, e.attempt, source), _word_count().transform
        )
    assert txlog.transaction("twice", 1).status is TxStatus.FAILED


# -- item 2 on Spark: two jobs of one txid stage the same state ----------------------------------


def test_two_spark_jobs_staging_one_state_are_both_committed(txlog, tmp_path, spark):
    """The second job's rows replaced the first's and the count check passed."""
    from pyspark.sql import functions as F

    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.spark.job import BatchJob, process_batch
    from airflow_txn_provider.transactions.commit import commit_registered

    data = {"0": random_lines(6, 40), "1": random_lines(7, 25)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 100)
    txlog.register_pipeline("shared", source_kind="transactional", max_pending=2)
    counts = MapState("shared", "shared_c", keys={"what": "text"}).create(txlog.engine)
    e = txlog.begin_next("shared", source)
    job = BatchJob("shared", 1, e.attempt, source, finish=False)

    def lines(batch):
        return batch.select(F.lit("lines").alias("what"), F.lit(1).cast("long").alias("delta"))

    def partitions(batch):
        return batch.groupBy(F.concat(F.lit("p"), "p").alias("what")).agg(
            F.count("*").alias("delta")
        )

    for transform in (lines, partitions, lines):  # the rerun of `lines` replaces its own rows
        assert process_batch(spark, txlog, job, transform).status == "staged"
    assert record_processed(txlog, "shared", 1, e.attempt) == "accept"
    assert txlog.transaction("shared", 1).output == {counts.output_key: 65 + 2}
    commit_registered(txlog, "shared", 1, e.attempt)
    with txlog.engine.connect() as conn:
        assert counts.items(conn) == {("lines",): 65, ("p0",): 40, ("p1",): 25}


# -- item 4: offsets going backwards stop begin visibly ------------------------------------------


def test_a_partition_renumbered_from_zero_stops_begin_visibly(txlog, tmp_path):
    """Clamped, begin said "no new data" until the partition grew past its old end, then the
    records in between were never read."""
    import shutil

    from airflow_txn_provider.rules.exceptions import OffsetsWentBackError
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    root = parquet_dataset(tmp_path / "ds", {"0": random_lines(8, 30), "1": random_lines(9, 5)})
    source = PartitionedParquetSource(str(root), 100)
    txlog.register_pipeline("back", source_kind="transactional", max_pending=2)
    assert txlog.begin_next("back", source).metadata == {"0": [0, 30], "1": [0, 5]}
    shutil.rmtree(root / "p=0")  # rewritten: offsets from 0 again, fewer than were read
    parquet_dataset(root, {"0": random_lines(10, 12)})
    with pytest.raises(OffsetsWentBackError, match="partition '0' went back") as err:
        txlog.begin_next("back", source)
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("back", 2, 1)
    assert "ended at offset 30" in str(err.value) and "now ends at 12" in str(err.value)
    assert txlog.transaction("back", 2) is None  # nothing emitted
