"""The plugin's health endpoint on a real Postgres log: a pipeline that commits is ok, one with
nothing to do idle, one whose waiting txid does not move for ``stall_after`` seconds stalled
(503, named); only what the user may read is judged, and nobody anonymous is told anything."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import MapState, stage_states
from airflow_txn_provider.transactions.commit import commit_registered
from tests.integration.ui.plugin_client import plugin_client

pytestmark = pytest.mark.integration

DAGS = {"busy": frozenset({"busy_dag"}), "quiet": frozenset({"quiet_dag"})}


class Steps(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


class Reader:
    """Stands for Airflow's auth manager: reads the DAGs in ``dags`` (``None``: every DAG)."""

    def __init__(self, dags: set[str] | None = None) -> None:
        self.dags = dags

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        return self.dags is None

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return set(self.dags or ())


def client(txlog, manager) -> TestClient:
    return plugin_client(txlog, manager, pipeline_dags=DAGS)


def commit(txlog, pipeline, state, txid):
    e = txlog.begin(pipeline, txid, Steps())
    txlog.stage_output(
        pipeline,
        txid,
        e.attempt,
        lambda conn: stage_states(conn, txid, e.attempt, {state: [("k", 1)]}),
    )
    assert commit_registered(txlog, pipeline, txid, e.attempt).applied


@pytest.fixture
def seeded(txlog):
    """``busy``: txids 1-2 committed, 3 processing; ``quiet``: txid 1 committed, nothing else."""
    for name in DAGS:
        txlog.register_pipeline(name, source_kind="transactional", max_pending=2)
        state = MapState(name, f"{name}_counts", "transactional", keys={"key": "text"})
        state.create(txlog.engine)
        commit(txlog, name, state, 1)
    commit(txlog, "busy", MapState.load(txlog.engine, "busy_counts"), 2)
    assert txlog.begin("busy", 3, Steps()).emitted
    return txlog


def test_a_moving_pipeline_is_ok_and_an_idle_one_idle(seeded):
    answer = client(seeded, Reader()).get("/transactions/api/health")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "ok" and body["stalled"] == []
    by_name = {p["pipeline"]: p for p in body["pipelines"]}
    assert by_name["busy"]["status"] == "ok" and by_name["quiet"]["status"] == "idle"
    busy = by_name["busy"]
    assert (busy["last_committed"], busy["newest_txid"], busy["lag_begun"]) == (2, 3, 1)
    assert busy["lag_processed"] == 0 and 0 <= busy["last_commit_age"] < 60
    assert 0 <= busy["stalled_for"] < 60


def test_a_txid_that_does_not_move_stalls_its_pipeline_503(seeded):
    time.sleep(1.2)
    answer = client(seeded, Reader()).get("/transactions/api/health?stall_after=1")
    assert answer.status_code == 503, answer.text
    assert answer.json()["stalled"] == ["busy"]
    one = client(seeded, Reader()).get("/transactions/api/pipelines/busy/health?stall_after=1")
    assert one.status_code == 503 and one.json()["stalled_for"] > 1
    quiet = client(seeded, Reader()).get("/transactions/api/pipelines/quiet/health?stall_after=1")
    assert quiet.status_code == 200 and quiet.json()["status"] == "idle"
    # it moves again: ok
    commit(seeded, "busy", MapState.load(seeded.engine, "busy_counts"), 3)
    again = client(seeded, Reader()).get("/transactions/api/health?stall_after=1")
    assert again.status_code == 200 and again.json()["stalled"] == []


def test_only_what_the_user_may_read_is_judged(seeded):
    time.sleep(1.2)
    mine = client(seeded, Reader({"quiet_dag"})).get("/transactions/api/health?stall_after=1")
    assert mine.status_code == 200  # busy is stalled, but not theirs to see
    assert [p["pipeline"] for p in mine.json()["pipelines"]] == ["quiet"]
    other = client(seeded, Reader({"quiet_dag"})).get("/transactions/api/pipelines/busy/health")
    assert other.status_code == 403
    assert client(seeded, None).get("/transactions/api/health").status_code in (401, 403)
    bad = client(seeded, Reader()).get("/transactions/api/health?stall_after=0")
    assert bad.status_code == 422


def test_a_lease_nobody_expired_stalls_the_pipeline_on_the_endpoint_and_the_page(
    txlog, monkeypatch
):
    """Its failure sensor was ended by hand (the DAG paused, so no waker mends it): after
    ``STUCK_AFTER`` past the lease the endpoint says so, whatever ``stall_after``, and so does
    the Transactions page (the index and the pipeline's card)."""
    from airflow_txn_provider.log import health

    monkeypatch.setattr(health, "STUCK_AFTER", 0.2)
    txlog.register_pipeline("busy", source_kind="transactional", max_pending=2)
    assert txlog.begin("busy", 1, Steps(), claim_timeout=0.2).emitted
    time.sleep(0.6)
    web = client(txlog, Reader())
    answer = web.get("/transactions/api/pipelines/busy/health")
    assert answer.status_code == 503, answer.text
    reason = answer.json()["reason"]
    assert "txid 1 attempt 1 is processing" in reason and "past its lease" in reason
    page = web.get("/transactions/api/pipelines/busy").json()["pipeline"]["health"]
    assert page["status"] == "stalled" and "txid 1 attempt 1 is processing" in page["reason"]
    index = web.get("/transactions/").text
    assert ">stalled</span>" in index and "past its lease" in index
    card = web.get("/transactions/pipelines/busy").text
    assert 'id="health"' in card and "stalled: txid 1 attempt 1 is processing" in card
