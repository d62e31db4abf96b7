"""The rewind action of the Transactions page's API on a real Postgres log: only a user who may
edit every DAG of the pipeline rewinds it, the rewind is written to the audit log and the runs
restarted (both stood in for: the REST API path is tested on a real Airflow by the CLI test,
tests/integration/on_airflow/test_kafka_airflow.py), a refused rewind changes nothing, and a bad
request is refused before anything is read. The page's "Rewind to here" is offered on the txids the
endpoint accepts, and enabled for the users it lets rewind (the browser test clicks it)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import MapState, load_states, stage_states
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.ui import actions
from airflow_txn_provider.ui import app as ui_app
from airflow_txn_provider.ui.actions import NOT_AN_EDITOR
from tests.integration.ui.plugin_client import plugin_client

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
        client = plugin_client(
            txlog, manager, user=FakeUser("alice"), pipeline_dags={PIPELINE: frozenset(dags)}
        )
        app = ui_app.app

        def restart(dag_ids, result):
            self.restarted.append((list(dag_ids), result.to_txid, result.rewound))
            return ["run: task"]

        app.dependency_overrides[actions.run_restarter] = lambda: restart
        app.dependency_overrides[actions.audit_logger] = lambda: (
            lambda dag_ids, owner, extra: self.audit.append((list(dag_ids), owner, extra))
        )
        return client


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


# -- the page's "Rewind to here" ---------------------------------------------------------------

PAGE = f"/transactions/pipelines/{PIPELINE}"


def _offered(client) -> tuple[dict, dict[int, dict | None]]:
    data = client.get(f"/transactions/api/pipelines/{PIPELINE}").json()
    return data, {row["txid"]: row["rewind"] for row in data["txids"]}


def test_the_page_offers_a_rewind_on_the_txids_the_endpoint_accepts(pipeline):
    """The page and the endpoint ask the same rule (history.plan_rewind from the floor
    retention and the undo records leave): here undo records from txid 3 on only."""
    with pipeline.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE txn_pipeline SET undo_from_txid = 3 WHERE name = %s", (PIPELINE,)
        )
    client = Recorder().client(pipeline, FakeAuthManager(edits=(DAG,)))
    data, offered = _offered(client)
    assert sorted(t for t, option in offered.items() if option) == [3, 4]
    assert data["rewind"] == {"floor": 3, "newest": 5, "text": "a rewind reaches back to txid 3"}
    assert offered[3] == {
        "to_txid": 3,
        "through": 4,
        "span": "txids 3 … 4",
        "text": "txids 3 … 4 will be recomputed, in order: the commits of txids 3 … 4 are undone.",
        "states": f"Every state of {PIPELINE} goes back to its value after txid 2.",
    }
    html = client.get(PAGE).text
    assert html.count('class="rewind"') == 2 and 'data-to="3"' in html and 'data-to="2"' not in html
    assert 'data-rewind-allowed="true"' in html and " disabled " not in html
    assert f'data-url="/transactions/api/pipelines/{PIPELINE}/rewind"' in html
    assert "a rewind reaches back to txid 3" in html

    refused = client.post(URL, json={"to_txid": 2})  # not offered: refused, with the floor
    assert refused.status_code == 409 and refused.json()["floor"] == "3"
    done = client.post(URL, json={"to_txid": 3})
    assert done.status_code == 200 and done.json()["rewound"] == [3, 4]

    # Now 3 and 4 are in flight again: a rewind to 3 would restart them, none to 4 (ahead).
    data, offered = _offered(client)
    assert sorted(t for t, option in offered.items() if option) == [3]
    assert offered[3]["text"] == (
        "txids 3 … 4 will be recomputed, in order: txids 3 … 4, in flight, start over."
    )
    assert data["rewind"]["newest"] == 3


def test_after_retention_the_page_offers_no_rewind_below_what_it_kept(pipeline):
    with pipeline.engine.begin() as conn:  # as if retention had pruned txid 1
        conn.exec_driver_sql(
            "UPDATE txn_pipeline SET pruned_through_txid = 1 WHERE name = %s", (PIPELINE,)
        )
    data, offered = _offered(Recorder().client(pipeline, FakeAuthManager(edits=(DAG,))))
    assert sorted(t for t, option in offered.items() if option) == [3, 4]  # txid 2's row kept
    assert data["rewind"]["floor"] == 3


@pytest.mark.parametrize(
    ("manager", "dags", "allowed"),
    [
        (FakeAuthManager(edits=(DAG,)), (DAG,), True),
        (FakeAuthManager(edits="all"), (), True),
        (FakeAuthManager(), (DAG,), False),  # reads it, edits nothing
        (FakeAuthManager(edits=(DAG,)), (DAG, "another_dag"), False),  # one of its two DAGs
    ],
)
def test_the_action_is_enabled_for_those_the_endpoint_lets_rewind(pipeline, manager, dags, allowed):
    html = Recorder().client(pipeline, manager, dags=dags).get(PAGE).text
    buttons = re.findall(r"<button type=\"button\" class=\"rewind\"[^>]*>", html)
    assert len(buttons) == 4  # txids 1-4 committed, from the floor (1) on
    if allowed:
        assert not any(" disabled" in b for b in buttons)
        assert 'title="recompute txids 1 … 4"' in buttons[-1]  # newest first: txid 1 last
    else:
        assert all(f' disabled title="{NOT_AN_EDITOR}"' in b for b in buttons)
        assert 'data-rewind-allowed="false"' in html
    assert '<dialog id="rewind-dialog"' in html
