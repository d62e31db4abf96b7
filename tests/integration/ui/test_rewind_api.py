"""The rewind action of the Transactions page's API on a real Postgres log: only a user who may
edit every DAG of the pipeline rewinds it, the rewind is written to the audit log and the runs
restarted (both stood in for: the REST API path is tested on a real Airflow by the CLI test,
tests/integration/test_kafka_airflow.py), a refused rewind changes nothing, and a bad request
is refused before anything is read."""

from __future__ import annotations

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient

from airflow_txn_provider.commit import commit_registered
from airflow_txn_provider.plugins import TxnProviderPlugin
from airflow_txn_provider.sources import TransactionalSource
from airflow_txn_provider.state import MapState, load_states, stage_states
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import actions
from airflow_txn_provider.ui import app as ui_app
from airflow_txn_provider.vocabulary import TxStatus

PIPELINE, DAG = "rw_api", "rw_api_dag"


class Steps(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


class FakeUser:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


class FakeAuthManager:
    """Reads every DAG; edits the DAGs in ``edits`` (``all``: every DAG)."""

    def __init__(self, edits: tuple[str, ...] | str = ()) -> None:
        self.edits = edits

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if method == "GET":
            return True
        assert method == "PUT"
        if self.edits == "all":
            return True
        return details is not None and details.id in self.edits

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return set()


@pytest.fixture
def pipeline(txlog):
    """Txids 1-4 committed, each adding its number to key 'k'."""
    state = MapState(PIPELINE, "rw_api_counts", "transactional", keys={"key": "text"})
    state.create(txlog.engine)
    txlog.register_pipeline(PIPELINE, source_kind="transactional", max_pending=2)
    for txid in range(1, 5):
        e = txlog.begin(PIPELINE, txid, Steps())
        txlog.stage_output(
            PIPELINE,
            txid,
            e.attempt,
            lambda conn, t=txid, a=e.attempt: stage_states(conn, t, a, {state: [("k", t)]}),
        )
        assert commit_registered(txlog, PIPELINE, txid, e.attempt).applied
    return txlog


class Recorder:
    def __init__(self) -> None:
        self.audit: list[tuple] = []
        self.restarted: list[tuple] = []

    def client(self, txlog, manager, *, dags=(DAG,)) -> TestClient:
        app = ui_app.app
        app.dependency_overrides.clear()
        app.dependency_overrides[ui_access.log_opener] = lambda: lambda: txlog
        pipeline_dags = {PIPELINE: frozenset(dags)}
        app.dependency_overrides[ui_access.get_pipeline_dags] = lambda: lambda _log: pipeline_dags
        if manager is not None:
            app.dependency_overrides[get_user] = lambda: FakeUser("alice")
            app.dependency_overrides[ui_access.auth_manager] = lambda: manager

        def restart(dag_ids, result):
            self.restarted.append((list(dag_ids), result.to_txid, result.rewound))
            return ["run: task"]

        app.dependency_overrides[actions.run_restarter] = lambda: restart
        app.dependency_overrides[actions.audit_logger] = lambda: (
            lambda dag_ids, owner, extra: self.audit.append((list(dag_ids), owner, extra))
        )
        parent = FastAPI()
        [entry] = TxnProviderPlugin.fastapi_apps
        parent.mount(entry["url_prefix"], entry["app"])
        return TestClient(parent)


@pytest.fixture(autouse=True)
def _clean_overrides():
    yield
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()


URL = f"/transactions/api/pipelines/{PIPELINE}/rewind"


def _value(txlog):
    with txlog.engine.connect() as conn:
        return load_states(conn, PIPELINE)["rw_api_counts"].items(conn).get(("k",))


def test_an_editor_rewinds_and_it_is_audited_and_the_runs_restarted(pipeline):
    recorder = Recorder()
    client = recorder.client(pipeline, FakeAuthManager(edits=(DAG,)))
    response = client.post(URL, json={"to_txid": 3, "job_version": "v2", "reason": "bug"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["to_txid"], body["last_committed_before"], body["rewound"]) == (3, 4, [3, 4])
    assert (body["by"], body["dag_ids"], body["restarted"]) == ("alice", [DAG], 1)
    assert _value(pipeline) == 1 + 2  # as after txid 2
    assert pipeline.last_committed(PIPELINE) == 2
    assert pipeline.transaction(PIPELINE, 3).status is TxStatus.FAILED
    [(dag_ids, owner, extra)] = recorder.audit
    assert (dag_ids, owner, extra["to_txid"], extra["job_version"]) == ([DAG], "alice", 3, "v2")
    assert recorder.restarted == [([DAG], 3, (3, 4))]


@pytest.mark.parametrize(
    ("manager", "dags"),
    [
        (FakeAuthManager(), (DAG,)),  # reads it, edits nothing
        (FakeAuthManager(edits=(DAG,)), (DAG, "another_dag")),  # edits one of its two DAGs
        (FakeAuthManager(edits=(DAG,)), ()),  # no known DAG: only an editor of every DAG
    ],
)
def test_a_user_who_may_not_edit_every_dag_of_the_pipeline_is_refused(pipeline, manager, dags):
    recorder = Recorder()
    response = recorder.client(pipeline, manager, dags=dags).post(URL, json={"to_txid": 2})
    assert response.status_code == 403, response.text
    assert "edit every DAG" in response.json()["detail"]
    assert pipeline.last_committed(PIPELINE) == 4 and _value(pipeline) == 10
    assert recorder.audit == [] and recorder.restarted == []


def test_nobody_signed_in_is_refused(pipeline):
    response = Recorder().client(pipeline, None).post(URL, json={"to_txid": 2})
    assert response.status_code == 401
    assert pipeline.last_committed(PIPELINE) == 4


def test_a_refused_rewind_says_why_and_changes_nothing(pipeline):
    recorder = Recorder()
    client = recorder.client(pipeline, FakeAuthManager(edits="all"), dags=())
    ahead = client.post(URL, json={"to_txid": 9})
    assert ahead.status_code == 409 and ahead.json()["error"] == "RewindAheadError"
    with pipeline.engine.begin() as conn:  # as if retention had pruned up to txid 1
        conn.exec_driver_sql(
            "UPDATE txn_pipeline SET pruned_through_txid = 1 WHERE name = %s", (PIPELINE,)
        )
    too_far = client.post(URL, json={"to_txid": 2})
    assert too_far.status_code == 409
    assert (too_far.json()["error"], too_far.json()["floor"]) == ("RewindTooFarError", "3")
    assert pipeline.last_committed(PIPELINE) == 4 and _value(pipeline) == 10
    assert recorder.audit == [] and recorder.restarted == []
    bad = client.post(URL, json={"to_txid": 0})
    assert bad.status_code == 422
