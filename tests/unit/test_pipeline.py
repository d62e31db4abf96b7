"""A pipeline's declaration (pipeline.py): its defaults, and what ``TxnPipeline`` refuses to be
made with (its jobs, states, sinks and settings)."""

from __future__ import annotations

import math

import pytest

from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sinks import DeltaSink
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState


def _pipeline(jobs=("spark_jobs/word_count.py",), **kw):
    kw.setdefault("states", [MapState("words", "word_counts", keys={"word": "text"})])
    return TxnPipeline(
        name="words", source=PartitionedParquetSource("/data/words"), jobs=jobs, **kw
    )


def test_a_pipeline_runs_its_jobs_the_way_its_pyspark_can_by_default():
    from airflow_txn_provider.compat.spark import DEFAULT_SPARK_MODE, SUPPORTS_CONNECT

    # Spark Connect needs PySpark 4: with 3.5 beside Airflow the example DAGs spark-submit
    assert _pipeline().spark == DEFAULT_SPARK_MODE == ("connect" if SUPPORTS_CONNECT else "submit")
    assert _pipeline(spark="submit").spark == "submit"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_pending": 0}, "max_pending"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"spark": "yarn"}, "spark must be one of"),
        ({"jobs": ()}, "at least one processing job"),
        ({"jobs": ("a/x.py", "b/x.py")}, "must differ"),
    ],
)
def test_bad_pipeline_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _pipeline(**kwargs)


def test_state_of_another_pipeline_is_refused():
    with pytest.raises(ValueError, match="belongs to pipeline 'other'"):
        TxnPipeline(
            name="words",
            source=PartitionedParquetSource("/d"),
            jobs=["j.py"],
            states=[MapState("other", "s", keys={"k": "text"})],
        )


@pytest.mark.parametrize("interval", [0, 0.0, -1, math.nan, math.inf])
def test_poll_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="poll_interval"):
        TxnPipeline(
            name="p", source=GeneratedTextSource(), jobs=["j.py"], states=[], poll_interval=interval
        )


def test_a_positive_poll_interval_is_accepted():
    p = TxnPipeline(
        name="p", source=GeneratedTextSource(), jobs=["j.py"], states=[], poll_interval=0.2
    )
    assert p.poll_interval == 0.2


class TestPipelineWithSinks:
    def _pipeline(self, **kw):
        return TxnPipeline(
            name=kw.pop("name", "p"),
            source=GeneratedTextSource(),
            jobs=kw.pop("jobs", ["spark_jobs/word_count.py"]),
            states=[],
            **kw,
        )

    def test_one_asset_per_sink(self):
        p = self._pipeline(sinks=[DeltaSink("events", table_uri="/lake/e")])
        (asset,) = p.assets
        assert asset.name == "txn:p:events" and asset.uri == "file:///lake/e"

    def test_several_jobs_and_clashing_names_are_refused(self):
        sink = DeltaSink("events", table_uri="/lake/e")
        with pytest.raises(ValueError, match="exactly one processing job"):
            self._pipeline(sinks=[sink], jobs=["a.py", "b.py"])
        with pytest.raises(ValueError, match="names must differ"):
            self._pipeline(sinks=[sink, DeltaSink("events", table_uri="/lake/f")])
        with pytest.raises(ValueError, match="lake staging directory"):
            self._pipeline(name="has space", sinks=[sink])


def test_expectations_are_declared_on_the_pipelines_states():
    from airflow_txn_provider import (
        Check,
        FailingShare,
        RowCondition,
        RowCount,
        RowCountWithinSigma,
    )

    rules = [
        RowCondition(on="word_counts", condition="delta > 0", action="drop"),
        RowCount(on="word_counts", min=1),
        Check(on="word_counts", fn=lambda rows: (True, ""), name="any"),
    ]
    assert _pipeline(expectations=rules).expectations == tuple(rules)
    with pytest.raises(ValueError, match="names must differ"):
        _pipeline(expectations=[rules[0], rules[0]])
    sink = DeltaSink("events", table_uri="/lake/e")
    with pytest.raises(ValueError, match="is on 'nope'; expectations are checked on the pipeline"):
        _pipeline(expectations=[RowCondition(on="nope", condition="delta > 0")], sinks=[sink])
    # on the input batch and a lake sink: SQL ones, measured by the Spark job (drops split there)
    measured = [
        RowCondition(condition="line IS NOT NULL"),  # on="input" by default
        RowCondition(condition="line <> ''", action="drop"),
        RowCondition(on="events", condition="word <> 'x'", action="drop"),
        Check(on="events", fn=lambda rows: (True, ""), name="given the staged rows"),
        RowCount(min=1, action="fail"),
        RowCountWithinSigma(on="events", k=3),
        FailingShare(on="events", condition="word <> ''", max_share=0.1, action="fail"),
        RowCondition(on="events", condition="length(word) < 50", action="fail"),
    ]
    assert _pipeline(expectations=measured, sinks=[sink]).expectations == tuple(measured)
    for exp, refused in [
        (Check(fn=lambda b: (True, ""), name="c"), "'c' on the input batch: a Check is not"),
    ]:
        with pytest.raises(ValueError, match=f"pipeline 'words': expectation {refused}"):
            _pipeline(expectations=[exp], sinks=[sink])
    with pytest.raises(ValueError, match="on the input batch needs exactly one processing job"):
        _pipeline(expectations=measured[1:2], jobs=["a.py", "b.py"])
