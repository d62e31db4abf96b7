"""Expectations on the input batch and on lake sinks (issue 60), measured in the Spark job
(``spark/audit.py``) and judged in the commit, on real components: the session's local Spark,
a real Postgres log, real Delta and Iceberg tables. Ground truth: the same rules applied in plain
Python to the batch's lines and the rows written for each sink."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import functions as F
from sqlalchemy import create_engine, text

from airflow_txn_provider import (
    Check,
    ExpectationsFailedError,
    FailingShare,
    RowCondition,
    RowCount,
)
from airflow_txn_provider.log.expectations import quarantined
from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks import DeltaSink, IcebergSink
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.audit import for_job
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts
from txn_testing.postgres import EmbeddedPostgres

pytestmark = pytest.mark.integration


def _outcomes(txlog, p, txid):
    return {o["expectation"]: o for o in txlog.attempts(p, txid)[-1].expectations}


def _process(spark, txlog, p, e, source, transform, expectations, sinks=()):
    measured = for_job(expectations, sinks)
    job = BatchJob(p, e.txid, e.attempt, source, sinks=tuple(sinks), expectations=measured)
    assert BatchJob.from_args(job.to_args()) == job  # as spark-submit would give it
    return process_batch(spark, txlog, job, transform)


def _word_count(state: str):
    def transform(batch):
        words = batch.select(F.explode(F.split("line", " ")).alias("word"))
        return {state: words.groupBy("word").agg(F.count("*").alias("delta"))}

    return transform


def test_expectations_on_the_input_batch_warn_with_exact_counts_and_a_failed_one_stops(
    txlog, spark, tmp_path
):
    p = "audit_in"
    # txid 1 reads 10 lines of each partition (20 rows), txids 2 and 3 10 of partition 0 each
    data = {"0": random_lines(60, 30), "1": random_lines(61, 10)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    counts = MapState(p, f"{p}_words", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, states=[counts])
    apples = RowCondition(condition="line LIKE '%apple%'", name="apples")  # warn
    strict = [apples, RowCount(min=15, action="fail", name="size")]
    truth: Counter[str] = Counter()

    first = txlog.begin_next(p, source)
    lines = lines_in_ranges(data, first.metadata)
    assert len(lines) == 20
    _process(spark, txlog, p, first, source, _word_count(counts.name), strict)
    assert commit_registered(txlog, p, first.txid, first.attempt, (), strict).applied
    truth.update(word_counts(lines))
    found = _outcomes(txlog, p, first.txid)
    failing = [line for line in lines if "apple" not in line]
    assert failing  # the data has lines without it: the warn is exercised
    assert (found["apples"]["rows_checked"], found["apples"]["rows_failed"]) == (20, len(failing))
    assert found["apples"]["taken"] == "warned" and found["apples"]["on"] == "input"
    names = {
        f"p={part}, offset={offset}"
        for part, (start, end) in first.metadata.items()
        for offset in range(start, end)
        if "apple" not in data[part][offset]
    }
    assert len(names) == len(failing)
    keys = found["apples"]["sample_keys"]
    assert len(keys) == min(5, len(failing)) and set(keys) <= names
    assert found["size"] == {**found["size"], "taken": "passed", "rows_checked": 20}

    second = txlog.begin_next(p, source)
    assert len(lines_in_ranges(data, second.metadata)) == 10
    _process(spark, txlog, p, second, source, _word_count(counts.name), strict)
    with pytest.raises(ExpectationsFailedError) as err:
        commit_registered(txlog, p, second.txid, second.attempt, (), strict)
    assert "'size' on input: 10 rows, expected rows >= 15" in str(err.value)
    assert txlog.transaction(p, 2).status is TxStatus.FAILED
    assert txlog.history(p, 2)[-1].failed_expectation
    assert txlog.last_committed(p) == 1
    with txlog.engine.connect() as conn:
        assert counts.items(conn) == {(w,): n for w, n in truth.items()}  # nothing of txid 2
    assert _outcomes(txlog, p, 2)["size"]["taken"] == "failed"

    fixed = [apples, RowCount(min=5, action="fail", name="size")]  # the rule fixed: a Clear
    replay = txlog.begin(p, 2, source)
    assert replay.attempt > second.attempt and replay.metadata == second.metadata
    _process(spark, txlog, p, replay, source, _word_count(counts.name), fixed)
    assert commit_registered(txlog, p, 2, replay.attempt, (), fixed).applied
    truth.update(word_counts(lines_in_ranges(data, second.metadata)))
    with txlog.engine.connect() as conn:
        assert counts.items(conn) == {(w,): n for w, n in truth.items()}
    assert _outcomes(txlog, p, 2)["size"]["taken"] == "passed"

    # A job that measured nothing (an older version's): a fail one stops the txid, warn ones warn
    third = txlog.begin_next(p, source)
    older = BatchJob(p, third.txid, third.attempt, source)
    process_batch(spark, txlog, older, _word_count(counts.name))
    with pytest.raises(ExpectationsFailedError, match="'size' on input: not measured by the job"):
        commit_registered(txlog, p, third.txid, third.attempt, (), fixed)
    replay = txlog.begin(p, third.txid, source)
    older = BatchJob(p, third.txid, replay.attempt, source)
    process_batch(spark, txlog, older, _word_count(counts.name))
    assert commit_registered(txlog, p, third.txid, replay.attempt, (), [apples]).applied
    missing = _outcomes(txlog, p, third.txid)["apples"]
    assert (missing["taken"], missing["message"]) == ("warned", "not measured by the job")


def _sink(kind, tmp_path):
    if kind == "delta":  # appends; a failing row is named by its first columns
        return DeltaSink("words", table_uri=str(tmp_path / "lake" / "words"))
    # merged by word: a failing row is named by its key
    wh = str(tmp_path / "wh")
    return IcebergSink("words", table="lake.audit_words", warehouse=wh, mode="merge", keys=["word"])


def _table(sink, db_url, p):
    table = sink.open(db_url)
    rows = table.read(table.version_as_of(p, 10**9)).to_pylist()
    return Counter((r["word"], r["delta"]) for r in rows)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_expectations_on_a_lake_sinks_rows_warn_exactly_and_a_failed_one_keeps_them_out(
    txlog, db_url, spark, tmp_path, kind
):
    p = f"audit_{kind}"
    short = [f"w{i}" for i in range(10)]  # the vocabulary's words shorter than 3
    data = {"0": random_lines(62, 10) + [" ".join(short[i : i + 6]) for i in range(4)] * 2}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    sink = _sink(kind, tmp_path)
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, sinks=[sink])
    rare = RowCondition(on="words", condition="delta < 3", name="rare")  # warn
    share = FailingShare(on="words", condition="length(word) >= 3", max_share=0.5, action="fail")
    strict = [rare, share]

    def transform(batch):
        words = batch.select(F.explode(F.split("line", " ")).alias("word"))
        return {"words": words.groupBy("word").agg(F.count("*").alias("delta"))}

    def judged(e, rules):  # ground truth: the rows written for the sink, the rules in Python
        written = word_counts(lines_in_ranges(data, e.metadata))
        often = {w for w, n in written.items() if not n < 3}
        too_short = {w for w in written if not len(w) >= 3}
        found = _outcomes(txlog, p, e.txid)
        assert found["rare"]["rows_checked"] == found[share.name]["rows_checked"] == len(written)
        assert (found["rare"]["rows_failed"], found["rare"]["taken"]) == (
            len(often),
            "warned" if often else "passed",
        )
        fails = len(too_short) > 0.5 * len(written)
        action = next(r for r in rules if r.name == share.name).action
        taken = ("failed" if action == "fail" else "warned") if fails else "passed"
        assert (found[share.name]["rows_failed"], found[share.name]["taken"]) == (
            len(too_short),
            taken,
        )
        named = {
            f"word={w}" if kind == "iceberg" else f"word={w}, delta={n}"
            for w, n in written.items()
            if n >= 3
        }
        keys = found["rare"]["sample_keys"]
        assert len(keys) == min(5, len(often)) and set(keys) <= named
        return written

    first = txlog.begin_next(p, source)
    _process(spark, txlog, p, first, source, transform, strict, [sink])
    assert commit_registered(txlog, p, first.txid, first.attempt, [sink], strict).applied
    written = judged(first, strict)
    assert _outcomes(txlog, p, first.txid)["rare"]["taken"] == "warned"  # the warn is exercised
    assert _table(sink, db_url, p) == Counter(written.items())

    second = txlog.begin_next(p, source)  # only short words: the share fails, the txid stops
    _process(spark, txlog, p, second, source, transform, strict, [sink])
    with pytest.raises(ExpectationsFailedError) as err:
        commit_registered(txlog, p, second.txid, second.attempt, [sink], strict)
    assert f"{share.name!r} on words:" in str(err.value)
    judged(second, strict)
    assert txlog.history(p, second.txid)[-1].failed_expectation
    assert txlog.last_committed(p) == 1
    assert _table(sink, db_url, p) == Counter(written.items())  # the table did not get them

    fixed = [rare, FailingShare(on="words", condition="length(word) >= 3", max_share=0.5)]
    assert fixed[1].name == share.name  # the same expectation, now warning: a Clear reruns it
    replay = txlog.begin(p, second.txid, source)
    _process(spark, txlog, p, replay, source, transform, fixed, [sink])
    assert commit_registered(txlog, p, second.txid, replay.attempt, [sink], fixed).applied
    later = judged(replay, fixed)
    if kind == "delta":
        assert _table(sink, db_url, p) == Counter(written.items()) + Counter(later.items())
    else:
        assert _table(sink, db_url, p) == Counter({**written, **later}.items())


def test_a_condition_spark_cannot_analyse_stops_the_txid_naming_it_whatever_its_action(
    txlog, spark, tmp_path
):
    p = "audit_bad"
    data = {"0": random_lines(63, 5)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    counts = MapState(p, f"{p}_words", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, states=[counts])
    rules = [
        RowCondition(condition="no_such_column > 0", name="bad"),  # warn, yet it cannot be checked
        RowCondition(condition="line IS NOT NULL", name="good"),
        RowCount(min=1),
    ]
    e = txlog.begin_next(p, source)
    _process(spark, txlog, p, e, source, _word_count(counts.name), rules)
    with pytest.raises(ExpectationsFailedError, match="'bad' on input: cannot be checked: "):
        commit_registered(txlog, p, e.txid, e.attempt, (), rules)
    found = _outcomes(txlog, p, e.txid)
    assert found["bad"]["taken"] == "failed" and "no_such_column" in found["bad"]["message"]
    assert (found["good"]["rows_checked"], found["good"]["taken"]) == (5, "passed")
    assert txlog.last_committed(p) == 0


def _drop_data():
    """Lines of which some hold a ``zzz`` word (the input's drop) and words of two letters
    (the sink's drop): both drops are exercised in every txid."""
    lines = random_lines(64, 40)
    return {"0": [f"{line} zzz" if i % 4 == 0 else f"{line} ab" for i, line in enumerate(lines)]}


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_drops_on_the_input_and_a_lake_sink_commit_and_quarantine_the_batch_exactly(
    txlog, db_url, spark, tmp_path, kind
):
    p = f"audit_drop_{kind}"
    data = _drop_data()
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    if kind == "delta":
        sink = DeltaSink("words", table_uri=str(tmp_path / "lake" / "words"))
    else:
        sink = IcebergSink("words", table="lake.drop_words", warehouse=str(tmp_path / "wh"))
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, sinks=[sink])
    no_zzz = RowCondition(condition="line NOT LIKE '%zzz%'", action="drop", name="no zzz")
    long_words = RowCondition(on="words", condition="length(word) > 2", action="drop", name="long")
    given = []  # what a Check on the sink is given: the rows staged for it, drops taken out

    def all_long(rows):
        given.append(rows)
        return all(len(r["word"]) > 2 for r in rows), f"{len(rows)} rows"

    check = Check(on="words", fn=all_long, action="fail")
    rules = [no_zzz, long_words, RowCount(on="words", min=1, action="fail"), check]
    words = _word_count("words")

    def truth(metadata):  # plain Python: the same rules on the batch's lines
        lines = lines_in_ranges(data, metadata)
        kept = [line for line in lines if "zzz" not in line]
        written = word_counts(kept)
        return lines, kept, {w: n for w, n in written.items() if len(w) > 2}, written

    committed: Counter[tuple[str, int]] = Counter()
    for txid in (1, 2, 3):
        e = txlog.begin_next(p, source)
        if txid == 2:  # an attempt that stages its drops, then fails: none of its rows stay
            _process(spark, txlog, p, e, source, words, rules, [sink])
            txlog.fail(p, e.txid, e.attempt, error="failed by the test")
            e = txlog.begin(p, e.txid, source)
        _process(spark, txlog, p, e, source, words, rules, [sink])
        assert commit_registered(txlog, p, e.txid, e.attempt, [sink], rules).applied
        lines, kept, published, written = truth(e.metadata)
        committed.update(published.items())
        with txlog.engine.connect() as conn:
            held = quarantined(conn, p, txid=e.txid, limit=10**6)
        assert {r.attempt for r in held} == {e.attempt}
        dropped_lines = [r.row["line"] for r in held if r.output == "input"]
        assert all(r.expectations == ("no zzz",) for r in held if r.output == "input")
        assert Counter(kept) + Counter(dropped_lines) == Counter(lines)  # = the batch, exactly
        dropped_words = {r.row["word"]: r.row["delta"] for r in held if r.output == "words"}
        assert all(r.expectations == ("long",) for r in held if r.output == "words")
        assert len(dropped_words) == sum(1 for r in held if r.output == "words")
        assert {**published, **dropped_words} == written and not published.keys() & dropped_words
        found = _outcomes(txlog, p, e.txid)
        assert (found["no zzz"]["taken"], found["no zzz"]["rows_failed"]) == (
            "dropped",
            len(lines) - len(kept),
        )
        assert (found["long"]["rows_checked"], found["long"]["rows_failed"]) == (
            len(written),
            len(dropped_words),
        )
        assert _table(sink, db_url, p) == committed  # the table holds only what met the rules
        assert Counter((r["word"], r["delta"]) for r in given[-1]) == Counter(published.items())
        assert found[check.name]["taken"] == "passed"
    with txlog.engine.connect() as conn:  # nothing left staged: the failed attempt's went too
        assert conn.execute(text("SELECT count(*) FROM txn_quarantine_staging")).scalar() == 0

    txlog.rewind(p, 3, by="test")  # takes txid 3's quarantined rows back with it
    with txlog.engine.connect() as conn:
        assert {r.txid for r in quarantined(conn, p, limit=10**6)} == {1, 2}


def test_a_backend_killed_while_a_lake_sinks_drops_are_judged_heals_with_nothing_lost_or_doubled(
    spark, tmp_path
):
    with EmbeddedPostgres(durable=True) as pg:  # a backend kill resets the whole server
        txlog = TransactionLog(create_engine(pg.url, pool_pre_ping=True))
        p = "audit_drop_crash"
        data = _drop_data()
        source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
        sink = DeltaSink("words", table_uri=str(tmp_path / "lake" / "words"))
        txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, sinks=[sink])
        kills = []

        def crash_once(rows):  # in the commit's transaction, before the drops are published
            if not kills:
                kills.append(pg.kill_backend())
            return True, "ok"

        rules = [
            RowCondition(condition="line NOT LIKE '%zzz%'", action="drop", name="no zzz"),
            RowCondition(on="words", condition="length(word) > 2", action="drop", name="long"),
            Check(on="words", fn=crash_once, name="crash once"),
        ]
        e = txlog.begin_next(p, source)
        _process(spark, txlog, p, e, source, _word_count("words"), rules, [sink])
        # the staged drops are logged: the commit, retried on a new connection, audits again
        assert commit_registered(txlog, p, e.txid, e.attempt, [sink], rules).applied
        assert kills and txlog.transaction(p, e.txid).status is TxStatus.COMMITTED
        _dropped_exactly(txlog, p, e, data, sink, pg.url)
        txlog.engine.dispose()


def _dropped_exactly(txlog, p, e, data, sink, db_url):
    """``e``'s batch of ``_drop_data`` committed: its ``zzz`` lines and its words of two letters
    quarantined, once, by its attempt; the table holds the other words; nothing left staged."""
    lines = lines_in_ranges(data, e.metadata)
    written = word_counts(line for line in lines if "zzz" not in line)
    with txlog.engine.connect() as conn:
        held = quarantined(conn, p, limit=10**6)
        staged = conn.execute(text("SELECT count(*) FROM txn_quarantine_staging")).scalar()
    assert staged == 0 and {r.attempt for r in held} == {e.attempt}
    assert Counter(r.row["line"] for r in held if r.output == "input") == Counter(
        line for line in lines if "zzz" in line
    )
    short = {r.row["word"]: r.row["delta"] for r in held if r.output == "words"}
    assert short == {w: n for w, n in written.items() if len(w) <= 2} and short
    published = {w: n for w, n in written.items() if len(w) > 2}
    assert _table(sink, db_url, p) == Counter(published.items())


def test_drops_on_spark_connect_leave_the_batch_counted_in_one_pass(
    txlog, db_url, tmp_path, connect_server, monkeypatch
):
    p = "audit_drop_connect"
    data = _drop_data()
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    # the transform's pass completes the batch's observed counts; the drops read apart
    monkeypatch.setattr(
        type(source), "batch_mismatch", lambda *a: pytest.fail("a second pass over the batch")
    )
    sink = DeltaSink("words", table_uri=str(tmp_path / "lake" / "words"))
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=4, sinks=[sink])
    rules = [
        RowCondition(condition="line NOT LIKE '%zzz%'", action="drop", name="no zzz"),
        RowCondition(on="words", condition="length(word) > 2", action="drop", name="long"),
    ]
    runner = SparkConnectRunner(_word_count("words"), url=connect_server.url)
    e = txlog.begin_next(p, source)
    job = BatchJob(p, e.txid, e.attempt, source, sinks=(sink,), expectations=for_job(rules, [sink]))
    runner.run(job, txlog)
    assert commit_registered(txlog, p, e.txid, e.attempt, [sink], rules).applied
    _dropped_exactly(txlog, p, e, data, sink, db_url)
