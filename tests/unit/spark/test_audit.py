"""The pure parts of the job's audit (issue 60, ``spark/audit.py``): which expectations a job
measures, how they travel in a spark-submitted job's arguments (``BatchJob.to_args`` /
``from_args``), and how a measurement is recorded for the commit. The Spark side is measured
against plain Python in ``tests/integration/spark/test_audit.py``."""

from __future__ import annotations

import json

import pytest

from airflow_txn_provider.rules.expectations import (
    INPUT,
    SAMPLE_KEYS,
    FailingShare,
    Measured,
    RowCondition,
    RowCount,
    RowCountWithinSigma,
)
from airflow_txn_provider.rules.vocabulary import AUDIT_OUTPUT_PREFIX, audit_output_key
from airflow_txn_provider.sinks import DeltaSink, IcebergSink
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.audit import (
    conditions_of,
    for_job,
    from_arg,
    measured_record,
    render_key,
    sample_columns,
    to_arg,
)
from airflow_txn_provider.spark.job import BatchJob

EXPECTATIONS = (
    RowCondition(on=INPUT, condition="line IS NOT NULL", name="lines"),
    RowCount(on=INPUT, min=1, max=100, action="fail"),
    RowCondition(on="words", condition="length(word) < 20", action="fail"),
    FailingShare(on="words", condition="word <> ''", max_share=0.1),
    RowCountWithinSigma(on="words", k=3, last=10),
    RowCondition(on="counts", condition="delta > 0"),  # a state's: the commit measures it
)


def test_a_job_measures_the_expectations_on_the_input_and_its_lake_sinks_only():
    sinks = [DeltaSink("words", table_uri="/tmp/lake/words")]
    assert for_job(EXPECTATIONS, sinks) == EXPECTATIONS[:5]
    assert for_job(EXPECTATIONS, []) == EXPECTATIONS[:2]
    assert audit_output_key(INPUT) == f"{AUDIT_OUTPUT_PREFIX}input" == "audit:input"
    assert audit_output_key("words") == "audit:words"


def test_a_batch_job_keeps_its_expectations_through_spark_submit_arguments(tmp_path):
    source = PartitionedParquetSource(str(tmp_path / "ds"), 10)
    sinks = (
        DeltaSink("words", table_uri=str(tmp_path / "lake")),
        IcebergSink("more", table="lake.more", warehouse=str(tmp_path / "wh")),
    )
    measured = for_job(EXPECTATIONS, sinks)
    for finish in (True, False):
        job = BatchJob("p", 3, 2, source, finish, sinks, True, measured)
        back = BatchJob.from_args(job.to_args())
        assert back == job and back.expectations == measured
        assert [type(e) for e in back.expectations] == [type(e) for e in measured]
    plain = BatchJob("p", 3, 2, source)
    assert "--expectations" not in plain.to_args()  # an older job's arguments, unchanged
    assert BatchJob.from_args(plain.to_args()) == plain and plain.expectations == ()
    assert from_arg(to_arg(measured)[1]) == measured and to_arg(()) == []
    bad = [*plain.to_args(), "--expectations", json.dumps([{"kind": "Check", "on": "input"}])]
    with pytest.raises(SystemExit):
        BatchJob.from_args(bad)
    with pytest.raises(ValueError, match="JSON list"):
        from_arg('{"kind": "RowCount"}')


def test_each_distinct_condition_is_counted_once():
    assert conditions_of(EXPECTATIONS) == [
        "line IS NOT NULL",
        "length(word) < 20",
        "word <> ''",
        "delta > 0",
    ]
    twice = [RowCondition(on=INPUT, condition="x > 0"), FailingShare(on=INPUT, condition="x > 0")]
    assert conditions_of(twice) == ["x > 0"]


def test_a_failing_row_is_named_by_its_keys_or_its_first_columns():
    assert sample_columns(["word", "n", "delta"], ["word"]) == ["word"]
    assert sample_columns(["a", "b", "c", "d"], []) == ["a", "b", "c"]
    assert sample_columns(["line", "partition", "offset"], [None, "partition", "p", "offset"]) == [
        "partition",
        "offset",
    ]
    assert sample_columns(["line", "p", "offset"], ["part", "off", "p", "offset"]) == [
        "p",
        "offset",
    ]
    # Spark's to_json leaves NULL fields out; a key shows them, and every value as text
    assert render_key('{"p":"0","offset":12}', ["p", "offset"]) == "p=0, offset=12"
    assert render_key('{"word":"x"}', ["word", "n"]) == "word=x, n=NULL"
    assert render_key('{"a":[1,2],"b":1.5}', ["a", "b"]) == "a=[1, 2], b=1.5"


def test_a_measurement_is_recorded_as_the_commit_reads_it():
    cond, count = EXPECTATIONS[0], EXPECTATIONS[1]
    keys = [f"k{i}" for i in range(8)]
    record = measured_record(cond, 40, {cond.condition: 7}, {cond.condition: keys}, {})
    assert record == {
        "expectation": "lines",
        "rows_checked": 40,
        "rows_failed": 7,
        "sample_keys": keys[:SAMPLE_KEYS],
        "passed": None,
        "message": "",
    }
    assert json.loads(json.dumps(record)) == record
    assert Measured(**{**record, "sample_keys": tuple(record["sample_keys"])}).rows_failed == 7
    assert measured_record(count, 40, {cond.condition: 7}, {}, {}) == {
        **record,
        "expectation": count.name,
        "rows_failed": 0,
        "sample_keys": [],
    }
    assert measured_record(cond, 0, {}, {}, {cond.condition: "no column line"}) == {
        "expectation": "lines",
        "error": "no column line",
    }
