"""OpenLineage answers of a txid's tasks (airflow_txn_provider/utils/lineage.py), built and
serialized with the real OpenLineage client and validated against the spec's JSON schemas and the
provider's own; the log is a fake (the real one: test_kafka_airflow.py, test_credentials.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde

from airflow_txn_provider import (
    RowCondition,
    RowCount,
    RowCountWithinSigma,
    __version__,
)
from airflow_txn_provider.compat.airflow import TaskDeferred
from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.log.reads import AttemptInfo
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.expectations import (
    Measured,
    Taken,
    judge_expectations,
    outcome_record,
)
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks import DeltaSink, IcebergSink
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.utils.lineage import (
    BATCH_FACET,
    PRODUCER,
    QUALITY_FACET,
    RUN_FACET,
    SCHEMAS,
    TxidLineage,
    audited_datasets,
    path_dataset,
    postgres_dataset,
    task_lineage,
)
from txn_testing.openlineage import EventSchemas, spec_schemas

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


def _event(lineage: Any) -> dict[str, Any]:
    """A whole run event carrying ``lineage``, as the listener would send it, serialized."""
    event = RunEvent(
        eventType=RunState.COMPLETE,
        eventTime="2026-01-01T00:00:00+00:00",
        run=Run(runId="01950000-0000-7000-8000-000000000000", facets=lineage.run_facets),
        job=Job(namespace="default", name="words.commit"),
        producer=PRODUCER,
        inputs=lineage.inputs,
        outputs=lineage.outputs,
    )
    return json.loads(Serde.to_json(event))


@pytest.fixture(scope="module")
def schemas() -> EventSchemas:
    """The spec's schemas and the provider's own (shipped in the package)."""
    return spec_schemas(SCHEMAS)


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
    assert path_dataset("gs://bucket/wh/ns.db/t") == ("gs://bucket", "wh/ns.db/t")
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
    monkeypatch.setattr(commit, "txlog", lambda: _Log(info))
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


# -- as a consumer reads it: the spec's schemas, the provider's own facets, lake table names ---


def _committed_event(p: TxnPipeline, output: dict[str, Any]) -> dict[str, Any]:
    lineage = task_lineage(p, CLAIM, reads_batch=True, committed_output=output, log_url=LOG_URL)
    return _event(lineage)


def test_the_custom_facets_are_prefixed_and_name_their_shipped_schema_and_this_provider(schemas):
    p = _pipeline(sinks=[DeltaSink("counts", table_uri="/lake/counts")])
    output = {"staged:word_counts": 12, "lake:counts": {"commit": {"version": 5, "rows": 9}}}
    event = _committed_event(p, output)
    assert schemas.problems(event) == []
    run, batch = event["run"]["facets"][RUN_FACET], event["inputs"][0]["inputFacets"][BATCH_FACET]
    # the spec's custom facet naming: key <prefix>_<name>, both camelCase, one project's prefix
    assert (RUN_FACET, BATCH_FACET) == ("airflowTxn_transaction", "airflowTxn_batch")
    for facet in (run, batch):
        assert facet["_producer"] == PRODUCER and __version__ in PRODUCER
        base, _, pointer = facet["_schemaURL"].partition("#")
        name = pointer.removeprefix("/$defs/")
        shipped = json.loads((SCHEMAS / f"{name}.json").read_text())
        assert shipped["$id"] == base and name in shipped["$defs"]
    assert (run["txid"], run["attempt"], run["committed"]) == (7, 2, True)


def test_a_custom_facet_off_its_own_schema_is_caught(schemas):
    event = _committed_event(_pipeline(), {"staged:word_counts": 3})
    event["run"]["facets"][RUN_FACET]["txid"] = "7"
    [problem] = schemas.problems(event)
    assert RUN_FACET in problem and "AirflowTxnTransactionRunFacet" in problem


def _iceberg(warehouse: str, **kw: Any) -> IcebergSink:
    return IcebergSink("lake", table="ns.words", warehouse=warehouse, **kw)


@pytest.mark.parametrize(
    ("warehouse", "named"),
    [
        ("/srv/wh", ("file", "/srv/wh/ns.db/words")),
        ("s3://bucket/wh", ("s3://bucket", "wh/ns.db/words")),
    ],
)
def test_an_iceberg_table_is_named_by_its_location_with_its_catalog_table_as_a_symlink(
    schemas, warehouse, named
):
    sink = _iceberg(warehouse)
    output = {sink.output_key: {"commit": {"version": 8123, "rows": 4}}}
    event = _committed_event(_pipeline(sinks=[sink]), output)
    assert schemas.problems(event) == []
    [table] = [o for o in event["outputs"] if "symlinks" in o["facets"]]
    assert (table["namespace"], table["name"]) == named  # as OpenLineage's Spark integration
    assert table["facets"]["symlinks"]["identifiers"] == [
        {"namespace": "postgres://db.example:6543/txnlog", "name": "txn.ns.words", "type": "TABLE"}
    ]
    assert table["facets"]["version"]["datasetVersion"] == "8123"
    assert "secret" not in json.dumps(event)


def test_two_deployments_with_the_default_catalog_label_are_two_datasets():
    one, other = _iceberg("/srv/a/wh"), _iceberg("/srv/b/wh")
    assert one.uri == other.uri  # the Asset's name: the catalog's label, the same by default
    assert one.lineage_dataset() != other.lineage_dataset()


def test_an_iceberg_catalog_from_a_connection_names_its_database_and_a_missing_one_no_symlink(
    monkeypatch,
):
    monkeypatch.setenv("AIRFLOW_CONN_ICE", "postgresql://u:hush@cat.example:5433/catalog")
    sink = _iceberg("/srv/wh", catalog_conn_id="ice", catalog_name="lakes")
    assert sink.lineage_symlinks(LOG_URL) == [
        ("postgres://cat.example:5433/catalog", "lakes.ns.words", "TABLE")
    ]
    missing = _iceberg("/srv/wh", catalog_conn_id="gone")
    output = {missing.output_key: {"commit": {"version": 1, "rows": 1}}}
    sent = _json(
        task_lineage(
            _pipeline(sinks=[missing]),
            CLAIM,
            reads_batch=False,
            committed_output=output,
            log_url=LOG_URL,
        )
    )
    [table] = [o for o in sent["outputs"] if o["namespace"] == "file"]
    assert "symlinks" not in table["facets"]  # the event still goes, without the catalog's name


# -- the audit's outcomes as the spec's dataQualityAssertions (issue 60) -----------------------

STATE_DATASET = ("postgres://db.example:6543", "txnlog.public.txn_state_word_counts")
EXPECTATIONS = [
    RowCondition(on="word_counts", condition="word <> ''", action="drop", name="no empty word"),
    RowCondition(on="word_counts", condition="delta > 0", name="positive"),  # warn
    RowCount(on="word_counts", min=1, max=1_000, action="fail"),
    RowCountWithinSigma(on="word_counts", name="steady"),  # young: not enough history
]


def _outcomes(**failing: int) -> list[dict[str, Any]]:
    """:data:`EXPECTATIONS` judged over 40 staged rows, ``failing`` rows failing a condition
    (by name), with the real rules: the records a commit's audit stores."""
    measured = [
        Measured(e.name, 40, failing.get(e.name, 0), ("k",) * min(failing.get(e.name, 0), 1))
        for e in EXPECTATIONS
    ]
    verdict = judge_expectations(EXPECTATIONS, measured, {"steady": [40, 41]})
    return [outcome_record(o) for o in verdict.outcomes]


def _assertions(dataset: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    facet = dataset["inputFacets"][QUALITY_FACET]
    return {a["assertion"]: (a["success"], a["severity"]) for a in facet["assertions"]}


def test_a_commit_names_the_audited_state_with_its_assertions_valid_against_the_spec(schemas):
    outcomes = _outcomes(**{"no empty word": 3, "positive": 5})
    assert [o["taken"] for o in outcomes] == ["dropped", "warned", "passed", "not_enough_history"]
    lineage = task_lineage(
        _pipeline(expectations=EXPECTATIONS),
        CLAIM,
        reads_batch=True,
        committed_output={"staged:word_counts": 40},
        log_url=LOG_URL,
        expectations=outcomes,
    )
    event = _event(lineage)
    assert schemas.problems(event) == []
    source, state = event["inputs"]  # the state's table, named as the commit's output is
    assert QUALITY_FACET not in source["inputFacets"] and BATCH_FACET in source["inputFacets"]
    assert (state["namespace"], state["name"]) == STATE_DATASET
    assert [(o["namespace"], o["name"]) for o in event["outputs"]] == [STATE_DATASET]
    facet = state["inputFacets"][QUALITY_FACET]
    # the spec's own facet (1-1-0, the client's), so the check above was against its schema
    assert facet["_schemaURL"].startswith("https://openlineage.io/spec/facets/1-1-0/")
    assert _assertions(state) == {  # success: the data met it; warned and dropped did not
        "no empty word": (False, "warn"),
        "positive": (False, "warn"),
        "word_counts: rows in [1, 1000]": (True, "error"),
        "steady": (True, "warn"),
    }
    dropped = facet["assertions"][0]
    assert dropped["params"] == {
        "on": "word_counts",
        "action": "drop",
        "taken": "dropped",
        "rows_checked": 40,
        "rows_failed": 3,
    }
    assert dropped["description"] == outcomes[0]["message"] and "column" not in dropped
    assert "sample_keys" not in json.dumps(facet) and "secret" not in json.dumps(event)


def test_assertions_off_the_spec_schema_are_caught(schemas):
    lineage = task_lineage(
        _pipeline(), CLAIM, reads_batch=False, log_url=LOG_URL, expectations=_outcomes()
    )
    event = _event(lineage)
    event["inputs"][0]["inputFacets"][QUALITY_FACET]["assertions"][0]["success"] = "yes"
    [problem] = schemas.problems(event)
    assert QUALITY_FACET in problem and "DataQualityAssertionsDatasetFacet" in problem


def test_assertions_on_the_input_batch_or_a_dropped_output_go_on_the_source():
    records = [
        {"expectation": "a", "on": "input", "action": "warn", "taken": "passed"},
        {"expectation": "b", "on": "word_counts", "action": "warn", "taken": "warned"},
        {"expectation": "c", "on": "gone_state", "action": "fail", "taken": "failed"},
    ]
    p = _pipeline()
    found = audited_datasets(p, records, LOG_URL)
    assert {k: [o["expectation"] for o in v] for k, v in found.items()} == {
        ("file", "/data/words"): ["a", "c"],
        STATE_DATASET: ["b"],
    }
    # the processing task's source input carries its batch and the assertions, one dataset
    sent = _json(task_lineage(p, CLAIM, reads_batch=True, log_url=LOG_URL, expectations=records))
    source, state = sent["inputs"]
    assert set(source["inputFacets"]) == {BATCH_FACET, QUALITY_FACET}
    assert _assertions(source) == {"a": (True, "warn"), "c": (False, "error")}
    assert _assertions(state) == {"b": (False, "warn")}


def test_an_audit_on_a_source_without_a_name_is_left_out(monkeypatch):
    p = _pipeline()
    monkeypatch.setattr(type(p.source), "lineage_dataset", lambda self: None)
    records = [{"expectation": "a", "on": "input", "taken": "passed"}]
    assert audited_datasets(p, records, LOG_URL) == {}
    assert audited_datasets(p, [], LOG_URL) == {}


def _attempt(attempt: int, status: TxStatus, outcomes: list[dict[str, Any]]) -> AttemptInfo:
    return AttemptInfo(
        "words", 7, attempt, status, {}, None, None, None, None, None, expectations=outcomes
    )


class _AuditedLog(_Log):
    """The fake log, with attempts: the older one's audit unlike the claim's."""

    def __init__(self, info: _Info | None, attempts: list[AttemptInfo] | Exception) -> None:
        super().__init__(info)
        self.found = attempts
        self.reads = 0

    def attempts(self, pipeline: str, txid: int) -> list[AttemptInfo]:
        assert (pipeline, txid) == ("words", CLAIM["txid"])
        self.reads += 1
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


def _commit_task(monkeypatch, p: TxnPipeline, txlog: _Log) -> Any:
    monkeypatch.setenv("AIRFLOW_CONN_TXN_LOG_DEFAULT", LOG_URL.replace("+psycopg", ""))
    commit = build_dag(p).get_task("commit")
    monkeypatch.setattr(commit, "txlog", lambda: txlog)
    commit._lineage_claim = CLAIM
    return commit


def test_the_commit_task_names_its_own_attempts_audit_committed_or_failed(monkeypatch, schemas):
    passed = _outcomes()
    stopped = [o | {"taken": str(Taken.FAILED)} if o["action"] == "fail" else o for o in passed]
    older = _attempt(1, TxStatus.FAILED, passed)
    txlog = _AuditedLog(
        _Info(TxStatus.COMMITTED, 2, {"staged:word_counts": 40}),
        [older, _attempt(2, TxStatus.COMMITTED, passed)],
    )
    commit = _commit_task(monkeypatch, _pipeline(expectations=EXPECTATIONS), txlog)
    done = _event(commit.get_openlineage_facets_on_complete(None))
    assert schemas.problems(done) == [] and len(done["outputs"]) == 1
    [state] = done["inputs"]
    assert _assertions(state)["word_counts: rows in [1, 1000]"] == (True, "error")

    # a fail expectation failed the claim's attempt: the commit task fails, naming why
    txlog.found = [older, _attempt(2, TxStatus.FAILED, stopped)]
    failed = _event(commit.get_openlineage_facets_on_failure(None))
    assert schemas.problems(failed) == [] and failed["outputs"] == []
    [state] = failed["inputs"]
    assert (state["namespace"], state["name"]) == STATE_DATASET
    assert _assertions(state)["word_counts: rows in [1, 1000]"] == (False, "error")
    assert failed["run"]["facets"][RUN_FACET]["committed"] is False

    txlog.found = [older]  # the claim's attempt recorded no audit (it failed before it)
    assert commit.get_openlineage_facets_on_failure(None).inputs == []


def test_a_failed_read_of_the_audit_costs_the_assertions_never_the_event(monkeypatch):
    txlog = _AuditedLog(_Info(TxStatus.COMMITTED, 2, {}), OSError("the log is restarting"))
    commit = _commit_task(monkeypatch, _pipeline(expectations=EXPECTATIONS), txlog)
    done = commit.get_openlineage_facets_on_complete(None)
    assert (done.inputs, len(done.outputs), txlog.reads) == ([], 1, 1)
    assert commit.get_openlineage_facets_on_failure(None).inputs == []


def test_a_pipeline_without_expectations_reads_no_audit(monkeypatch):
    txlog = _AuditedLog(_Info(TxStatus.COMMITTED, 2, {}), [])
    commit = _commit_task(monkeypatch, _pipeline(), txlog)
    commit.get_openlineage_facets_on_complete(None)
    commit.get_openlineage_facets_on_failure(None)
    assert txlog.reads == 0


# -- the failure sensor's run ends with an event ----------------------------------------------


@pytest.mark.parametrize("lineage_on", [True, False])
def test_a_woken_failure_sensor_ends_on_a_worker_only_when_lineage_is_on(monkeypatch, lineage_on):
    """Woken on a worker, the listener sent its START: with lineage on, the commit must wake it
    on a worker again, whose listener sends COMPLETE (the triggerer sends nothing)."""
    sensor = build_dag(_pipeline()).get_task("watch_failures")
    monkeypatch.setattr(
        "airflow_txn_provider.sensors.txn_failure.lineage_enabled", lambda: lineage_on
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor._watch(3, 1, requeue=True)
    trigger = deferred.value.trigger
    assert (trigger.txid, trigger.attempt, trigger.requeue_timeout is not None) == (3, 1, True)
    assert trigger.end_task_on_commit is not lineage_on


@pytest.mark.parametrize("lineage_on", [True, False])
def test_an_unwoken_failure_sensor_still_starts_and_ends_in_the_triggerer(monkeypatch, lineage_on):
    """No worker start per txid, lineage on or off: a sensor no failure woke sent no START."""
    monkeypatch.setattr("airflow_txn_provider.utils.lineage.lineage_enabled", lambda: lineage_on)
    monkeypatch.setattr("airflow_txn_provider.run_context.STARTS_FROM_TRIGGER", True)
    sensor = build_dag(_pipeline()).get_task("watch_failures")
    assert sensor.start_from_trigger
    assert sensor.start_trigger_args.trigger_kwargs["end_task_on_commit"] is True


def test_the_facet_schemas_ship_as_package_data():
    root = Path(__file__).resolve().parents[3]
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    config = tomllib.loads((root / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["airflow_txn_provider"]
    files = sorted(SCHEMAS.glob("*.json"))
    assert len(files) == 2
    package = SCHEMAS.parents[1]  # airflow_txn_provider/, where the globs start
    assert all(any(f.relative_to(package).match(g) for g in globs) for f in files), globs
