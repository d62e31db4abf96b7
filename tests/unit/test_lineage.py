"""OpenLineage answers of a txid's tasks (airflow_txn_provider/lineage.py), built and serialized
with the real OpenLineage client; the log is a fake (the real one: test_kafka_airflow.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from openlineage.client.serde import Serde

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.lineage import (
    BATCH_FACET,
    RUN_FACET,
    TxidLineage,
    path_dataset,
    postgres_dataset,
    task_lineage,
)
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.sinks import DeltaSink
from airflow_txn_provider.spark.parquet_source import PartitionedParquetSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.vocabulary import TxStatus

LOG_URL = "postgresql+psycopg://txn:secret@db.example:6543/txnlog"
CLAIM = {"txid": 7, "attempt": 2, "metadata": {"0": [100, 200], "1": [40, 80]}}


def _pipeline(**kw: Any) -> TxnPipeline:
    return TxnPipeline(
        name="words",
        source=PartitionedParquetSource("/data/words"),
        jobs=["spark_jobs/word_count.py"],
        states=[MapState("words", "word_counts", keys={"word": "text"})],
        **kw,
    )


def _json(lineage: Any) -> dict[str, Any]:
    """What the listener would send of it: the datasets and facets, serialized."""
    sent = {
        "inputs": [Serde.to_dict(d) for d in lineage.inputs],
        "outputs": [Serde.to_dict(d) for d in lineage.outputs],
        "run": {k: Serde.to_dict(f) for k, f in lineage.run_facets.items()},
    }
    return json.loads(json.dumps(sent))


def test_dataset_names_follow_openlineage_naming():
    assert path_dataset("/data/words") == ("file", "/data/words")
    assert path_dataset("file:///lake/t") == ("file", "/lake/t")
    assert path_dataset("s3://bucket/lake/t") == ("s3://bucket", "lake/t")
    assert path_dataset("iceberg://cat/ns/t") == ("iceberg://cat", "ns/t")
    assert postgres_dataset(LOG_URL, "txn_state_word_counts") == (
        "postgres://db.example:6543",
        "txnlog.public.txn_state_word_counts",
    )


def test_a_task_that_reads_the_batch_names_the_source_with_the_batch_and_no_output():
    sent = _json(task_lineage(_pipeline(), CLAIM, reads_batch=True))
    run = sent["run"][RUN_FACET]
    assert (run["pipeline"], run["txid"], run["attempt"], run["committed"]) == (
        "words",
        7,
        2,
        False,
    )
    [source] = sent["inputs"]
    assert (source["namespace"], source["name"]) == ("file", "/data/words")
    assert source["inputFacets"][BATCH_FACET]["batch"] == CLAIM["metadata"]
    assert sent["outputs"] == []


def test_outputs_only_once_committed_with_versions_and_rows_and_never_the_password():
    p = _pipeline(sinks=[DeltaSink("counts", table_uri="/lake/counts")])
    output = {"staged:word_counts": 12, "lake:counts": {"commit": {"version": 5, "rows": 9}}}
    uncommitted = _json(task_lineage(p, CLAIM, reads_batch=False, log_url=LOG_URL))
    assert uncommitted["outputs"] == [] and uncommitted["inputs"] == []
    sent = _json(
        task_lineage(p, CLAIM, reads_batch=False, committed_output=output, log_url=LOG_URL)
    )
    assert sent["run"][RUN_FACET]["committed"] is True
    state, table = sent["outputs"]
    assert (state["namespace"], state["name"]) == (
        "postgres://db.example:6543",
        "txnlog.public.txn_state_word_counts",
    )
    assert state["outputFacets"]["outputStatistics"]["rowCount"] == 12
    assert (table["namespace"], table["name"]) == ("file", "/lake/counts")
    assert table["facets"]["version"]["datasetVersion"] == "5"
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 9
    assert "secret" not in json.dumps(sent)


def test_a_task_that_ended_before_its_claim_answers_nothing():
    lineage = task_lineage(_pipeline(), None, reads_batch=True)
    assert (lineage.inputs, lineage.outputs, lineage.run_facets) == ([], [], {})


@dataclass
class _Info:
    status: TxStatus
    attempt: int
    output: dict[str, Any]


class _Log:
    def __init__(self, info: _Info | None) -> None:
        self.info = info

    def transaction(self, pipeline: str, txid: int) -> _Info | None:
        assert (pipeline, txid) == ("words", CLAIM["txid"])
        return self.info


@pytest.mark.parametrize(
    ("info", "outputs"),
    [
        (_Info(TxStatus.COMMITTED, 2, {"staged:word_counts": 3}), 1),
        (_Info(TxStatus.COMMITTED, 3, {"staged:word_counts": 3}), 0),  # another attempt's commit
        (_Info(TxStatus.PROCESSED, 2, {"staged:word_counts": 3}), 0),
        (None, 0),
    ],
)
def test_the_commit_task_names_outputs_only_for_its_own_committed_attempt(
    info, outputs, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_TXN_LOG_DEFAULT", LOG_URL.replace("+psycopg", ""))
    commit = build_dag(_pipeline()).get_task("commit")
    assert isinstance(commit, TxidLineage) and commit.commits and not commit.reads_batch
    monkeypatch.setattr(commit, "txn_log", lambda: _Log(info))
    commit._lineage_claim = CLAIM
    assert len(commit.get_openlineage_facets_on_complete(None).outputs) == outputs
    assert commit.get_openlineage_facets_on_failure(None).outputs == []


def test_the_processing_task_names_its_batch_even_when_it_fails():
    process = build_dag(_pipeline()).get_task("process_word_count")
    assert isinstance(process, TxidLineage) and process.reads_batch and not process.commits
    process._lineage_claim = CLAIM
    failed = _json(process.get_openlineage_facets_on_failure(None))
    assert failed["inputs"][0]["inputFacets"][BATCH_FACET]["batch"] == CLAIM["metadata"]
    assert failed["outputs"] == [] and failed["run"][RUN_FACET]["committed"] is False
