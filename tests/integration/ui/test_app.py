"""The Transactions page on a real Postgres log: a pipeline driven through commits, a failure with
its cascade and a replay, two states; then the app, mounted as Airflow mounts it, asked as an
anonymous user, as a user who may read some DAGs, and as one who may read all; which DAG runs
which pipeline as Airflow's metadata database has the DAGs (a reused DAG id, a deleted DAG); and
what an error page tells (nothing of the database's address), with the log's database down or of
another schema version.

The page's script is run too (with Node, on a minimal DOM) against the JSON the app served: it
must render the same rows, draw the chart, and keep database text as text.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.log import schema
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.plugins import TxnProviderPlugin
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import GlobalState, MapState, stage_states
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app
from airflow_txn_provider.ui import reader
from tests.conftest import new_database, set_txn_log_connection
from tests.integration.ui.plugin_client import plugin_client

SCRIPT = '<script>alert("x")</script>'
UNAVAILABLE = "the transaction log is unavailable (see the api-server log)"
ERROR = f"{SCRIPT} executor lost"
BATCHES = {1: [("dog", 3), ("cat", 1)], 2: [("dog", 3), ("<i>emu</i>", 5)], 3: [("ant", 1)]}


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        start = prev["end"] if prev else 0
        return {"start": start, "end": start + 10, "path": "<b>batch</b>"}


def process(txlog, em, counts, total, rows):
    txlog.stage_output(
        em.pipeline,
        em.txid,
        em.attempt,
        lambda conn: stage_states(
            conn, em.txid, em.attempt, {counts: rows, total: [(sum(n for _, n in rows),)]}
        ),
    )


@pytest.fixture(scope="module")
def db(postgres):
    """One log for the module: ``words`` at txids 1-3 committed, 4 replayed and processed after
    its first attempt failed, 5 failed by 4's failure; ``secret`` with one commit and a state
    whose table is gone."""
    url = new_database(postgres)
    engine = create_engine(url)
    txlog = TransactionLog(engine, migrate=False)
    counts = MapState("words", "ui_word_counts", "transactional", keys={"word": "text"})
    total = GlobalState("words", "ui_total", "opaque")
    counts.create(engine)
    total.create(engine)
    txlog.register_pipeline("words", source_kind="transactional", max_pending=4)
    src = Batches()
    for txid, rows in BATCHES.items():
        em = txlog.begin("words", txid, src)
        process(txlog, em, counts, total, rows)
        commit_states(txlog, "words", txid, em.attempt, [counts, total])
    first4 = txlog.begin("words", 4, src)
    em5 = txlog.begin("words", 5, src)
    process(txlog, em5, counts, total, [("dog", 1)])
    assert txlog.fail("words", 4, first4.attempt, error=ERROR) == (4, 5)
    replay = txlog.begin_next("words", src)
    assert replay is not None and (replay.txid, replay.attempt) == (4, 2)
    process(txlog, replay, counts, total, [("cat", 2)])

    txlog.register_pipeline("secret", source_kind="opaque", max_pending=1)
    GlobalState("secret", "ui_gone").create(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE txn_state_ui_gone"))
    yield url, txlog
    engine.dispose()


class FakeAuthManager:
    """Stands for Airflow's auth manager: reads all DAGs, or only some; edits (``PUT``, what a
    rewind needs) the DAGs in ``edits``."""

    def __init__(
        self, *, all_dags: bool = False, dag_ids: tuple[str, ...] = (), edits: tuple[str, ...] = ()
    ):
        self.all_dags = all_dags
        self.dag_ids = set(dag_ids)
        self.edits = set(edits)

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if method == "PUT":
            return details is not None and details.id in self.edits
        assert method == "GET"
        return self.all_dags

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return set(self.dag_ids)


def as_recorded(txlog: TransactionLog | None) -> reader.DagPipelines:
    """Airflow's DAGs as a stand-in: each DAG the log records exists and runs what it recorded."""

    def dag_pipelines(dag_ids):
        recorded = txlog.pipeline_dags() if txlog is not None else {}
        return {d: frozenset(p for p, ds in recorded.items() if d in ds) for d in dag_ids}

    return dag_pipelines


def client_for(
    txlog: TransactionLog | None,
    manager: FakeAuthManager | None,
    pipeline_dags: dict[str, set[str]] | None = None,
    *,
    airflow: reader.DagPipelines | None = None,
) -> TestClient:
    """The plugin's app mounted like Airflow's api-server does; ``manager`` None: no user;
    ``txlog`` None: the log of the configured connection; ``pipeline_dags``: which DAGs run which
    pipeline now; else as the log records them, with Airflow's DAGs as ``airflow`` says (default:
    every recorded DAG exists as recorded; :func:`reader.airflow_dag_pipelines`: the real one)."""
    dags = None
    if pipeline_dags is not None:
        dags = {p: frozenset(ids) for p, ids in pipeline_dags.items()}
    client = plugin_client(txlog, manager, pipeline_dags=dags)
    if pipeline_dags is None and airflow is not reader.airflow_dag_pipelines:
        declared = airflow or as_recorded(txlog)
        ui_app.app.dependency_overrides[ui_access.dag_pipelines] = lambda: declared
    return client


@pytest.fixture
def admin(db):
    return client_for(db[1], FakeAuthManager(all_dags=True))


# -- auth --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/transactions/",
        "/transactions/pipelines/words",
        "/transactions/pipelines/words/runs/txid-000004",
        "/transactions/dags/words/runs/txid-000004",
        "/transactions/api/pipelines",
        "/transactions/api/pipelines/words",
        "/transactions/api/pipelines/words/txids/4",
    ],
)
def test_without_a_user_nothing_is_shown(db, path):
    response = client_for(db[1], None).get(path)
    assert response.status_code == 401
    assert "executor lost" not in response.text and "dog" not in response.text


def test_a_user_sees_only_pipelines_whose_dag_they_may_read(db):
    client = client_for(
        db[1],
        FakeAuthManager(dag_ids=("words", "some_other_dag")),
        {"words": {"words"}, "secret": {"secret"}},
    )
    listed = client.get("/transactions/api/pipelines").json()["pipelines"]
    assert [p["name"] for p in listed] == ["words"]
    assert "secret" not in client.get("/transactions/").text
    denied = client.get("/transactions/api/pipelines/secret")
    assert denied.status_code == 403
    assert denied.json()["pipeline"] == "secret"
    assert "'secret'" in denied.json()["detail"]
    page = client.get("/transactions/pipelines/secret/runs/txid-000001")
    assert page.status_code == 403 and "secret" in page.text


def test_a_pipeline_is_authorised_by_the_dag_that_runs_it_not_by_its_name(db):
    """build_dag(pipeline, dag_id=...) may name the DAG otherwise: readers of an unrelated DAG
    named like the pipeline saw it, readers of the real DAG got 403."""
    runs = {"words": {"words_etl"}, "secret": {"secret_etl"}}
    namesake = client_for(db[1], FakeAuthManager(dag_ids=("words",)), runs)
    assert namesake.get("/transactions/api/pipelines").json()["pipelines"] == []
    assert namesake.get("/transactions/api/pipelines/words").status_code == 403
    assert namesake.get("/transactions/pipelines/words/runs/txid-000001").status_code == 403
    reader_of_real_dag = client_for(db[1], FakeAuthManager(dag_ids=("words_etl",)), runs)
    listed = reader_of_real_dag.get("/transactions/api/pipelines").json()["pipelines"]
    assert [p["name"] for p in listed] == ["words"]
    assert reader_of_real_dag.get("/transactions/api/pipelines/words").status_code == 200
    assert reader_of_real_dag.get("/transactions/api/pipelines/secret").status_code == 403


def test_a_pipeline_no_known_dag_runs_is_shown_only_to_readers_of_every_dag(db):
    """Until the log records which DAG runs a pipeline, a DAG's name proves nothing."""
    assert reader.pipeline_dags(db[1], as_recorded(db[1])) == {}
    client = client_for(db[1], FakeAuthManager(dag_ids=("words", "secret")))
    assert client.get("/transactions/api/pipelines").json()["pipelines"] == []
    assert client.get("/transactions/api/pipelines/words").status_code == 403
    admin = client_for(db[1], FakeAuthManager(all_dags=True))
    assert admin.get("/transactions/api/pipelines/words").status_code == 200


def test_a_user_without_dags_sees_an_empty_list(db):
    client = client_for(db[1], FakeAuthManager())
    assert client.get("/transactions/api/pipelines").json()["pipelines"] == []
    assert "No pipeline you may read" in client.get("/transactions/").text


# -- index -------------------------------------------------------------------------------------


def test_the_log_lists_registered_pipelines(db):
    assert db[1].pipelines() == ["secret", "words"]


def test_index_counts_and_lag(admin):
    listed = {p["name"]: p for p in admin.get("/transactions/api/pipelines").json()["pipelines"]}
    assert set(listed) == {"secret", "words"}  # a pipeline without a DAG: shown to admins
    words = listed["words"]
    assert words["counts"] == {"processing": 0, "processed": 1, "committed": 3, "failed": 1}
    assert (words["last_committed"], words["newest_processed"], words["lag"]) == (3, 4, 1)
    assert (words["newest_txid"], words["oldest_failed"]) == (5, 5)
    assert listed["secret"]["counts"]["committed"] == 0

    html = admin.get("/transactions/").text
    assert 'href="/transactions/pipelines/words"' in html
    assert 'data-api="/transactions/api/pipelines"' in html
    assert "updated " in html and "committed 3" in html


# -- one pipeline ------------------------------------------------------------------------------


def test_pipeline_json(admin):
    data = admin.get("/transactions/api/pipelines/words").json()
    rows = {r["txid"]: r for r in data["txids"]}
    assert [r["txid"] for r in data["txids"]] == [5, 4, 3, 2, 1]
    assert [(rows[t]["status"], rows[t]["attempt"]) for t in (1, 2, 3, 4, 5)] == [
        ("committed", 1),
        ("committed", 1),
        ("committed", 1),
        ("processed", 2),
        ("failed", 1),
    ]
    assert rows[5]["failed_by_earlier"] == 4
    assert rows[5]["last_error"] == f"failed with txid 4: {ERROR}"
    assert rows[4]["failed_by_earlier"] is None
    assert rows[4]["last_error"] == ERROR  # the error of its previous attempt
    assert rows[4]["commit_wait_running"] is True
    assert rows[2]["metadata"] == {"start": 10, "end": 20, "path": "<b>batch</b>"}
    assert rows[1]["processing_s"] >= 0 and rows[1]["commit_wait_s"] >= 0
    assert rows[3]["run_id"] == "txid-000003"

    states = {s["name"]: s for s in data["states"]}
    assert states["ui_total"] == {
        "name": "ui_total",
        "kind": "opaque",
        "type": "global",
        "value": 13,
        "complete": "complete from txid 1",
        "partial": False,
    }
    word_counts = states["ui_word_counts"]
    assert (word_counts["keys"], word_counts["sum"]) == (4, 13)
    assert word_counts["top"] == [
        {"key": "dog", "value": 6},
        {"key": "<i>emu</i>", "value": 5},
        {"key": "ant", "value": 1},
        {"key": "cat", "value": 1},
    ]

    chart = data["chart"]
    assert [p[1] for p in chart["committed"]] == [1.0, 2.0, 3.0]
    assert [p[1] for p in chart["processed"]] == [1.0, 2.0, 3.0, 4.0]
    assert chart["lag"][-1][1] == 1.0
    assert chart["rate_per_min"] > 0
    assert data["pipeline"]["lag"] == 1


def test_pipeline_page_escapes_database_text(admin):
    response = admin.get("/transactions/pipelines/words")
    assert response.status_code == 200
    html = response.text
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; executor lost" in html
    assert "<b>batch</b>" not in html and "&lt;b&gt;batch&lt;/b&gt;" in html
    assert "<i>emu</i>" not in html and "&lt;i&gt;emu&lt;/i&gt;" in html
    assert "failed by txid 4" in html
    assert 'href="/dags/words/runs/txid-000004"' in html
    assert 'href="/transactions/pipelines/words/runs/txid-000005"' in html
    assert 'data-api="/transactions/api/pipelines/words"' in html
    for status in ("committed", "processed", "failed"):
        assert f'class="st st-{status}"' in html
    assert ">13<" in html  # the global state's value
    assert "4 keys" in html and "sum 13" in html


def test_a_state_that_cannot_be_read_says_why(admin):
    states = admin.get("/transactions/api/pipelines/secret").json()["states"]
    assert [s["type"] for s in states] == ["error"]
    assert "txn_state_ui_gone" in states[0]["error"]
    assert "does not exist" in admin.get("/transactions/pipelines/secret").text


# -- one txid ----------------------------------------------------------------------------------


def test_txid_attempt_history(admin):
    data = admin.get("/transactions/api/pipelines/words/txids/4").json()
    assert (data["current"]["attempt"], data["current"]["status"]) == (2, "processed")
    assert [(a["attempt"], a["status"]) for a in data["attempts"]] == [
        (2, "processed"),
        (1, "failed"),
    ]
    first = data["attempts"][1]
    assert (first["error"], first["failed_by"], first["failed_by_earlier"]) == (ERROR, 4, None)
    assert first["ended_at"] is not None and first["total_s"] >= 0

    cascaded = admin.get("/transactions/api/pipelines/words/txids/5").json()["attempts"]
    assert [(a["status"], a["failed_by_earlier"]) for a in cascaded] == [("failed", 4)]

    later = admin.get("/transactions/api/pipelines/words/txids/99").json()
    assert (later["current"], later["attempts"], later["last_committed"]) == (None, [], 3)


def test_the_dag_run_tab_shows_the_txid_attempts(admin):
    href = next(v for v in TxnProviderPlugin.external_views if v["destination"] == "dag_run")[
        "href"
    ]
    # What Airflow's UI does with the placeholders (encodeURIComponent of dag id and run id).
    url = href.replace("{DAG_ID}", quote("words", safe="")).replace(
        "{RUN_ID}", quote(txid_run_id(4), safe="")
    )
    response = admin.get(url)
    assert response.status_code == 200
    html = response.text
    assert "txid 4" in html
    assert html.count('<td class="num">2</td>') >= 1 and "attempt 2" in html
    assert SCRIPT not in html and "&lt;script&gt;" in html
    assert 'data-api="/transactions/api/pipelines/words/txids/4"' in html
    assert 'href="/dags/words/runs/txid-000004"' in html


def test_a_run_that_is_not_a_txid_run_gets_a_message(admin):
    run_id = "manual__2026-03-01T12:00:00+00:00"
    response = admin.get(f"/transactions/pipelines/words/runs/{quote(run_id, safe='')}")
    assert response.status_code == 200
    assert "is not a transaction" in response.text
    assert run_id in response.text
    assert "data-api" not in response.text  # nothing to refresh


def test_a_txid_that_has_not_begun(admin):
    response = admin.get("/transactions/pipelines/words/runs/txid-000042")
    assert response.status_code == 200
    assert "txid 42 has not begun yet" in response.text


# -- the DAG run tab, keyed by DAG id ----------------------------------------------------------


def tab_url(dag_id: str, run_id: str) -> str:
    """The DAG run tab's address as Airflow's UI fills it in (encodeURIComponent of both ids)."""
    href = next(v for v in TxnProviderPlugin.external_views if v["destination"] == "dag_run")[
        "href"
    ]
    return href.replace("{DAG_ID}", quote(dag_id, safe="")).replace(
        "{RUN_ID}", quote(run_id, safe="")
    )


@pytest.fixture(scope="module")
def renamed(postgres):
    """A log where DAG ``words_etl`` runs pipeline ``words`` (``build_dag(..., dag_id=...)``, as
    its begin task records it): txid 1 failed once, then processed. A pipeline that happens to be
    named ``words_etl`` (run by DAG ``other_dag``) has one attempt of txid 1: the trap of taking
    the DAG id for the pipeline's name."""
    engine = create_engine(new_database(postgres))
    txlog = TransactionLog(engine, migrate=False)
    src = Batches()
    txlog.register_pipeline("words", source_kind="transactional", max_pending=4, dag_id="words_etl")
    first = txlog.begin("words", 1, src)
    txlog.fail("words", 1, first.attempt, error="words attempt 1 lost")
    assert txlog.begin_next("words", src) is not None
    txlog.register_pipeline(
        "words_etl", source_kind="transactional", max_pending=4, dag_id="other_dag"
    )
    txlog.begin("words_etl", 1, src)
    yield txlog
    engine.dispose()


def test_the_dag_run_tab_shows_the_pipeline_its_dag_runs_not_its_namesake(renamed):
    assert reader.pipeline_dags(renamed, as_recorded(renamed)) == {
        "words": frozenset({"words_etl"}),
        "words_etl": frozenset({"other_dag"}),
    }
    for manager in (FakeAuthManager(all_dags=True), FakeAuthManager(dag_ids=("words_etl",))):
        response = client_for(renamed, manager).get(tab_url("words_etl", txid_run_id(1)))
        assert response.status_code == 200
        html = response.text
        assert 'data-api="/transactions/api/pipelines/words/txids/1"' in html
        assert "attempt 2" in html and "words attempt 1 lost" in html
        assert '/pipelines/words"' in html  # the crumb names the pipeline
        assert 'href="/dags/words_etl/runs/txid-000001"' in html  # the Airflow run: the DAG's id
    # The namesake pipeline is still reached through the DAG that runs it.
    other = client_for(renamed, FakeAuthManager(dag_ids=("other_dag",)))
    namesake = other.get(tab_url("other_dag", txid_run_id(1)))
    assert namesake.status_code == 200
    assert 'data-api="/transactions/api/pipelines/words_etl/txids/1"' in namesake.text
    assert "words attempt 1 lost" not in namesake.text


def test_the_dag_run_tab_needs_read_access_to_the_dag(renamed):
    """Reading the pipeline's namesake DAG, or the namesake pipeline's DAG, opens nothing."""
    for dag_ids in ((), ("words",), ("other_dag",)):
        client = client_for(renamed, FakeAuthManager(dag_ids=dag_ids))
        response = client.get(tab_url("words_etl", txid_run_id(1)))
        assert response.status_code == 403
        assert "DAG &#39;words_etl&#39;: you may not read this DAG" in response.text
        assert "words attempt 1 lost" not in response.text and "data-api" not in response.text


def test_an_unknown_dag_is_a_404_saying_no_pipeline_is_recorded(renamed):
    admin = client_for(renamed, FakeAuthManager(all_dags=True))
    # "words" is a pipeline's name, but the log records words_etl as its DAG: no fallback to it.
    for dag_id in ("nope", "words"):
        response = admin.get(tab_url(dag_id, txid_run_id(1)))
        assert response.status_code == 404
        assert f"DAG &#39;{dag_id}&#39;: no pipeline is recorded for this DAG yet" in response.text
        assert "words attempt 1 lost" not in response.text
    # A user who may not read the DAG learns nothing about it: 403 before looking it up.
    assert (
        client_for(renamed, FakeAuthManager(dag_ids=("words_etl",)))
        .get(tab_url("nope", txid_run_id(1)))
        .status_code
        == 403
    )


def test_without_a_record_the_tab_falls_back_to_a_readable_namesake(db):
    """A log that records no DAG yet (db): the pipeline named like the DAG, for users who may
    read it under the access rules; a reader of the namesake DAG alone is not one of them."""
    admin = client_for(db[1], FakeAuthManager(all_dags=True))
    response = admin.get(tab_url("words", txid_run_id(4)))
    assert response.status_code == 200
    assert 'data-api="/transactions/api/pipelines/words/txids/4"' in response.text
    namesake_reader = client_for(db[1], FakeAuthManager(dag_ids=("words",)))
    denied = namesake_reader.get(tab_url("words", txid_run_id(4)))
    assert denied.status_code == 404 and "no pipeline is recorded" in denied.text
    assert "executor lost" not in denied.text


def test_a_dag_recorded_for_several_pipelines_lists_them(db):
    client = client_for(
        db[1], FakeAuthManager(dag_ids=("both",)), {"words": {"both"}, "secret": {"both"}}
    )
    response = client.get(tab_url("both", txid_run_id(4)))
    assert response.status_code == 200
    assert 'href="/transactions/pipelines/secret/runs/txid-000004"' in response.text
    assert 'href="/transactions/pipelines/words/runs/txid-000004"' in response.text
    assert "executor lost" not in response.text


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/transactions/api/pipelines/nope",
        "/transactions/api/pipelines/nope/txids/1",
        "/transactions/pipelines/nope",
        "/transactions/pipelines/nope/runs/txid-000001",
        "/transactions/pipelines/nope/runs/manual__x",
    ],
)
def test_an_unknown_pipeline_is_a_404_naming_it(admin, path):
    response = admin.get(path)
    assert response.status_code == 404
    if "/api/" in path:
        assert response.json()["pipeline"] == "nope"
        assert "pipeline 'nope' is not registered" in response.json()["detail"]
    else:
        assert "pipeline &#39;nope&#39; is not registered" in response.text


def test_a_bad_txid_is_a_422(admin):
    assert admin.get("/transactions/api/pipelines/words/txids/0").status_code == 422
    assert admin.get("/transactions/api/pipelines/words/txids/x").status_code == 422


def test_a_database_gone_after_opening_is_a_503(db, monkeypatch):
    """The log as the page opens it (through its connection), then its database gone: a 503 after
    a short wait, not the minutes a task waits out a restart for."""
    url, _ = db
    set_txn_log_connection(monkeypatch, "ui_txn_log_gone", url)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "ui_txn_log_gone")
    txlog = ui_access.provider.get()
    ui_access.provider.reset()
    assert txlog.outage_timeout == reader.PAGE_OUTAGE_TIMEOUT <= 5
    txlog.engine.dispose()
    txlog.engine = create_engine("postgresql+psycopg2://u@127.0.0.1:1/none")  # nothing listens
    client = client_for(txlog, FakeAuthManager(all_dags=True))
    response = client.get("/transactions/api/pipelines/words")
    assert response.status_code == 503
    assert response.json()["detail"] == UNAVAILABLE
    page = client.get("/transactions/pipelines/words")
    assert page.status_code == 503 and UNAVAILABLE in page.text


def test_the_configured_airflow_connection_is_read(db, monkeypatch):
    """No stand-in for the log: the page opens it through TxnLogHook and the configured id."""
    url, _ = db
    set_txn_log_connection(monkeypatch, "ui_txn_log_test", url)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "ui_txn_log_test")
    client = client_for(None, FakeAuthManager(all_dags=True))
    names = [p["name"] for p in client.get("/transactions/api/pipelines").json()["pipelines"]]
    assert names == ["secret", "words"]
    assert ui_access.provider.get() is ui_access.provider.get()  # opened once, then kept


# -- authorisation first, error pages that name nothing ----------------------------------------

SECRET_ROLE = "txn_page_secret_role"
SECRET_DB = "txn_page_secret_db"


def closed_port() -> int:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_down(postgres, monkeypatch, how: str) -> str:
    """Point the page's connection at a log it cannot open: ``unreachable`` (nothing listens on
    its port) or ``unknown role`` (the real Postgres refuses the role). Returns the URL."""
    if how == "unreachable":
        url = f"postgresql+psycopg://{SECRET_ROLE}@127.0.0.1:{closed_port()}/{SECRET_DB}"
    else:
        url = f"postgresql+psycopg://{SECRET_ROLE}@127.0.0.1:{postgres.port}/{SECRET_DB}"
    set_txn_log_connection(monkeypatch, "ui_txn_log_down", url)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "ui_txn_log_down")
    monkeypatch.setattr(reader, "PAGE_OUTAGE_TIMEOUT", 0.2)  # a refused port: no 3 s per request
    return url


def assert_names_nothing_of(text: str, url: str) -> None:
    """The answer names neither the database's host, port, role nor database, nor the URL."""
    u = make_url(url)
    for secret in (u.host, f"port {u.port}", f":{u.port}", u.username, u.database, "psycopg"):
        assert str(secret) not in text, f"{secret!r} is in the answer: {text[:2000]}"


ALL_ROUTES = {
    "/transactions/": 200,
    "/transactions/api/pipelines": 200,
    "/transactions/pipelines/words": 403,
    "/transactions/pipelines/words/runs/txid-000001": 403,
    "/transactions/dags/words/runs/txid-000001": 403,
    "/transactions/api/pipelines/words": 403,
    "/transactions/api/pipelines/words/txids/1": 403,
}


@pytest.mark.parametrize("how", ["unreachable", "unknown role"])
def test_a_user_who_may_read_no_dag_gets_the_empty_answer_without_the_log_opened(
    postgres, monkeypatch, how
):
    """The log was opened before the DAG check: such a user got a 503 naming the log database's
    host and role. Now the auth manager is asked first, and the log is never touched."""
    url = log_down(postgres, monkeypatch, how)
    client = client_for(None, FakeAuthManager())  # signed in, no DAG
    for path, status in ALL_ROUTES.items():
        response = client.get(path)
        assert response.status_code == status, (path, response.text[:500])
        assert_names_nothing_of(response.text, url)
    assert client.get("/transactions/api/pipelines").json()["pipelines"] == []
    assert "No pipeline you may read" in client.get("/transactions/").text
    assert ui_access.provider._logs == {}  # never opened


def test_a_user_who_may_read_no_dag_never_opens_the_log(db):
    opened = []

    def open_log():
        opened.append(1)
        return db[1]

    client = client_for(db[1], FakeAuthManager())
    ui_app.app.dependency_overrides[ui_access.log_opener] = lambda: open_log
    for path, status in ALL_ROUTES.items():
        assert client.get(path).status_code == status, path
    assert opened == []


@pytest.mark.parametrize("how", ["unreachable", "unknown role"])
def test_a_503_names_nothing_of_the_database_and_the_server_log_says_why(
    postgres, monkeypatch, caplog, how
):
    url = log_down(postgres, monkeypatch, how)
    client = client_for(None, FakeAuthManager(all_dags=True))
    caplog.set_level(logging.ERROR, logger="airflow_txn_provider.ui.app")
    for path in (
        "/transactions/api/pipelines",
        "/transactions/",
        "/transactions/pipelines/words",
        "/transactions/dags/words/runs/txid-000001",
    ):
        response = client.get(path)
        assert response.status_code == 503, path
        assert UNAVAILABLE in response.text
        assert_names_nothing_of(response.text, url)
    assert client.get("/transactions/api/pipelines").json()["detail"] == UNAVAILABLE
    logged = [r for r in caplog.records if r.name == "airflow_txn_provider.ui.app"]
    assert logged and all(r.exc_info for r in logged)  # with the traceback
    said = caplog.text
    assert "'ui_txn_log_down'" in said and "cannot be reached" in said
    port = make_url(url).port
    assert (SECRET_ROLE in said) if how == "unknown role" else (f"port {port}" in said)


def test_a_database_lost_while_a_state_is_read_is_a_503_naming_nothing(admin, monkeypatch):
    """A state that cannot be read says why (its table is gone), but a lost database is no
    state's fault: its error (the host, the port) was shown as that state's error."""

    def lost(conn, state, url=""):
        raise OperationalError(
            "SELECT", {}, Exception('connection to server at "10.9.8.7", port 6543 failed')
        )

    monkeypatch.setattr(reader, "_SUMMARY_CACHE", {})
    monkeypatch.setattr(reader, "_state_summary", lost)
    for path in ("/transactions/api/pipelines/words", "/transactions/pipelines/words"):
        response = admin.get(path)
        assert response.status_code == 503 and UNAVAILABLE in response.text
        assert "10.9.8.7" not in response.text and "port 6543" not in response.text


@pytest.mark.parametrize(
    ("revision", "advice", "wrong_advice"),
    [
        (
            "9999",
            "upgrade airflow-txn-provider on this machine (every worker, scheduler and "
            "api-server) to the version that wrote it; do not downgrade the database",
            "run airflow_txn_provider.log.schema.upgrade",
        ),
        ("0007", "run airflow_txn_provider.log.schema.upgrade(engine)", "newer than this library"),
    ],
)
def test_a_log_of_another_schema_version_is_a_503_with_the_right_advice(
    postgres, monkeypatch, revision, advice, wrong_advice
):
    """A schema newer than the library was said to be too old, with the advice to upgrade it."""
    url = new_database(postgres)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {schema.VERSION_TABLE} SET version_num = :r"), {"r": revision})
    engine.dispose()
    set_txn_log_connection(monkeypatch, "ui_txn_log_versioned", url)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__UI_TXN_LOG_CONN_ID", "ui_txn_log_versioned")
    client = client_for(None, FakeAuthManager(all_dags=True))
    response = client.get("/transactions/api/pipelines")
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert detail.startswith("the transaction log is unavailable: ")
    assert f"revision {revision!r}" in detail and advice in detail
    assert wrong_advice not in detail
    assert_names_nothing_of(detail, url)
    page = client.get("/transactions/")
    assert page.status_code == 503 and advice in page.text and wrong_advice not in page.text


# -- a pairing follows its DAG: Airflow's metadata database as the DAG processor leaves it -------


class AirflowDags:
    """DAGs deployed into Airflow's metadata database (sqlite, migrated once a session), as the
    DAG processor would: each parse of a DAG file serializes its DAG, ``airflow dags delete``
    deletes it."""

    def deploy(self, pipeline: str, dag_id: str) -> TxnPipeline:
        """DAG ``dag_id``, built for ``pipeline`` by ``build_dag``, parsed and serialized."""
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

        p = TxnPipeline(
            name=pipeline,
            source=PartitionedParquetSource("/nonexistent"),
            jobs=["job.py"],
            states=[],
            max_pending=2,
        )
        bag = DagBag(dag_folder="/nonexistent", collect_dags=False)
        bag.dags[dag_id] = build_dag(p, dag_id=dag_id)
        sync_bag_to_db(bag, "dags-folder", None)
        return p

    def delete(self, dag_id: str) -> None:
        from airflow.api.common.delete_dag import delete_dag

        delete_dag(dag_id)


@pytest.fixture
def airflow_dags(airflow_db, monkeypatch):
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    # A DAG serialized less than 30 s ago is not written again (the DAG processor's default).
    monkeypatch.setenv("AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL", "0")
    DagBundlesManager().sync_bundles_to_db()
    return AirflowDags()


def claim(txlog: TransactionLog, p: TxnPipeline, dag_id: str) -> bool:
    """What the DAG's claiming task records before it begins a txid (``TxnOperator.claim``)."""
    return txlog.ensure_pipeline(
        p.name,
        source_kind=p.source.kind,
        max_pending=p.max_pending,
        dag_id=dag_id,
        states=p.states,
        keep_txids=p.keep_txids,
    )


def listed(client: TestClient) -> list[str]:
    return [p["name"] for p in client.get("/transactions/api/pipelines").json()["pipelines"]]


@pytest.fixture
def fresh_log(postgres):
    engine = create_engine(new_database(postgres))
    yield TransactionLog(engine, migrate=False)
    engine.dispose()


def test_a_reused_dag_id_no_longer_opens_the_pipeline_it_ran(airflow_dags, fresh_log):
    """DAG D ran pipeline P, then D is redeployed running Q: the pairing (P, D) kept granting
    P's transactions and state to D's readers. Now it counts only while D, as Airflow has it,
    runs P; it is deleted once D runs Q, and recorded again if D comes back running P."""
    txlog, dag = fresh_log, "ui_reused_dag"
    p = airflow_dags.deploy("ui_reused_p", dag)
    assert claim(txlog, p, dag) is True
    txlog.begin(p.name, 1, Batches())
    readers = client_for(
        txlog, FakeAuthManager(dag_ids=(dag,)), airflow=reader.airflow_dag_pipelines
    )
    assert listed(readers) == ["ui_reused_p"]
    assert readers.get("/transactions/api/pipelines/ui_reused_p").status_code == 200
    tab = readers.get(tab_url(dag, txid_run_id(1)))
    assert 'data-api="/transactions/api/pipelines/ui_reused_p/txids/1"' in tab.text

    q = airflow_dags.deploy("ui_reused_q", dag)  # redeployed: Q's claim has not run yet
    assert listed(readers) == []
    assert readers.get("/transactions/api/pipelines/ui_reused_p").status_code == 403
    assert readers.get("/transactions/pipelines/ui_reused_p/runs/txid-000001").status_code == 403
    tab = readers.get(tab_url(dag, txid_run_id(1)))
    assert tab.status_code == 404 and "ui_reused_p" not in tab.text
    assert txlog.pipeline_dags() == {}  # the stale pairing is gone from the log

    assert claim(txlog, q, dag) is True
    txlog.begin(q.name, 1, Batches())
    assert listed(readers) == ["ui_reused_q"]
    assert readers.get("/transactions/api/pipelines/ui_reused_p").status_code == 403
    assert 'txids/1"' in readers.get(tab_url(dag, txid_run_id(1))).text
    # (client_for sets the one app's overrides: a client made earlier asks as the newest user)
    admin = client_for(txlog, FakeAuthManager(all_dags=True), airflow=reader.airflow_dag_pipelines)
    tab = admin.get(tab_url(dag, txid_run_id(1)))  # one pipeline: not "several", P not offered
    assert 'data-api="/transactions/api/pipelines/ui_reused_q/txids/1"' in tab.text
    assert "ui_reused_p" not in tab.text

    readers = client_for(
        txlog, FakeAuthManager(dag_ids=(dag,)), airflow=reader.airflow_dag_pipelines
    )
    airflow_dags.deploy("ui_reused_p", dag)  # back to P: same declaration as before
    assert listed(readers) == []
    assert txlog.pipeline_dags() == {}
    assert claim(txlog, p, dag) is True  # its pairing was deleted: recorded again
    assert claim(txlog, p, dag) is False  # then one read, as before
    assert listed(readers) == ["ui_reused_p"]


def test_a_deleted_dag_no_longer_opens_its_pipeline(airflow_dags, fresh_log):
    """The auth manager may still grant a deleted DAG's id (permissions outlive DAGs, and a new
    DAG may take the id): the log's pairing no longer does."""
    txlog, dag = fresh_log, "ui_deleted_dag"
    r = airflow_dags.deploy("ui_deleted_r", dag)
    claim(txlog, r, dag)
    txlog.begin(r.name, 1, Batches())
    readers = client_for(
        txlog, FakeAuthManager(dag_ids=(dag,)), airflow=reader.airflow_dag_pipelines
    )
    assert listed(readers) == ["ui_deleted_r"]

    airflow_dags.delete(dag)
    assert listed(readers) == []
    assert readers.get("/transactions/api/pipelines/ui_deleted_r").status_code == 403
    assert readers.get("/transactions/api/pipelines/ui_deleted_r/txids/1").status_code == 403
    assert readers.get(tab_url(dag, txid_run_id(1))).status_code == 404
    assert txlog.pipeline_dags() == {}  # deleted with its DAG
    admin = client_for(txlog, FakeAuthManager(all_dags=True), airflow=reader.airflow_dag_pipelines)
    assert listed(admin) == ["ui_deleted_r"]  # the pipeline itself stays, for readers of all


def test_airflow_says_which_pipeline_each_dag_runs(airflow_dags):
    airflow_dags.deploy("ui_declared_a", "ui_declared_dag")
    assert reader.airflow_dag_pipelines(["ui_declared_dag", "ui_no_such_dag"]) == {
        "ui_declared_dag": frozenset({"ui_declared_a"})
    }
    airflow_dags.deploy("ui_declared_b", "ui_declared_dag")
    assert reader.airflow_dag_pipelines(["ui_declared_dag"]) == {
        "ui_declared_dag": frozenset({"ui_declared_b"})
    }


# -- the page's script -------------------------------------------------------------------------

DOM_HARNESS = r"""
const fs = require("fs");
const input = JSON.parse(fs.readFileSync(0, "utf8"));
const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
class Node {
  constructor() { this.childNodes = []; }
  append(...cs) {
    for (const c of cs) this.childNodes.push(c instanceof Node ? c : new Text(String(c)));
  }
  replaceChildren(...cs) { this.childNodes = []; this.append(...cs); }
  get textContent() { return this.childNodes.map((c) => c.textContent).join(""); }
  set textContent(v) { this.childNodes = []; if (v) this.append(String(v)); }
}
class Text extends Node {
  constructor(t) { super(); this.data = t; }
  get textContent() { return this.data; }
  html() { return esc(this.data); }
}
class Element extends Node {
  constructor(tag) { super(); this.tagName = tag; this.attrs = {}; this.hidden = false; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  set className(v) { this.attrs.class = v; }
  get className() { return this.attrs.class || ""; }
  get clientWidth() { return 800; }
  closest() { return null; }
  html() {
    const a = Object.entries(this.attrs)
      .map(([k, v]) => ` ${k}="${esc(v).replace(/"/g, "&quot;")}"`).join("");
    const inner = this.childNodes.map((c) => c.html()).join("");
    return `<${this.tagName}${a}>${inner}</${this.tagName}>`;
  }
}
const ids = {};
const names = ["pipelines", "summary", "chart", "states", "outputs", "txids", "current"];
names.push("attempts");
for (const id of [...names, "banner", "stamp"]) ids[id] = new Element("div");
ids.banner.hidden = true;
ids["txid-table"] = new Element("table");  // the rewind rights the page was rendered with
ids["txid-table"].dataset = input.table || {};
ids.stamp.textContent = "updated 00:00:00 UTC";
const body = new Element("body");
body.dataset = { root: "/transactions", airflowRoot: "", api: "/api", pollMs: "2500" };
body.dataset.page = input.page;
Object.assign(globalThis, {
  Node,
  Element,
  document: {
    body,
    hidden: false,
    getElementById: (id) => ids[id] || null,
    addEventListener() {},
    createElement: (t) => new Element(t),
    createElementNS: (ns, t) => new Element(t),
  },
  setInterval() {},
  addEventListener() {},
  fetch: async () => ({
    ok: input.status === 200, status: input.status, statusText: "", json: async () => input.payload,
  }),
});
globalThis.window = globalThis;
globalThis.top = globalThis;
require(input.script);
setTimeout(() => {
  const out = {};
  for (const [id, el] of Object.entries(ids)) {
    out[id] = { html: el.html(), text: el.textContent, hidden: el.hidden };
  }
  process.stdout.write(JSON.stringify(out));
}, 100);
"""


def run_script(page: str, payload: dict, status: int = 200, table: dict | None = None) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's script is not exercised")
    script = Path(ui_app.__file__).parent / "static" / "txn.js"
    done = subprocess.run(
        [node, "-e", DOM_HARNESS],
        input=json.dumps(
            {
                "page": page,
                "payload": payload,
                "status": status,
                "script": str(script),
                "table": table or {},
            }
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_script_renders_the_pipeline_page(admin):
    payload = admin.get("/transactions/api/pipelines/words").json()
    dom = run_script("pipeline", payload)
    txids = dom["txids"]["html"]
    assert txids.count("<tr>") == 5
    assert SCRIPT not in txids and "&lt;script&gt;" in txids
    assert "&lt;b&gt;batch&lt;/b&gt;" in txids
    assert 'href="/dags/words/runs/txid-000004"' in txids and "failed by txid 4" in txids
    assert "<svg" in dom["chart"]["html"] and "committed 3" in dom["chart"]["text"]
    assert "processed 4" in dom["chart"]["text"]
    assert "4 keys" in dom["states"]["text"] and "&lt;i&gt;emu&lt;/i&gt;" in dom["states"]["html"]
    assert dom["states"]["text"].count("complete from txid 1") == 2  # each state says it
    assert dom["outputs"]["html"].count("<tr>") == 2 and "ui_word_counts" in dom["outputs"]["text"]
    assert "lag1" in dom["summary"]["text"].replace(" ", "")
    assert dom["stamp"]["text"].startswith("updated ") and dom["stamp"]["text"].endswith(" UTC")
    assert dom["stamp"]["text"] != "updated 00:00:00 UTC"
    assert dom["banner"]["hidden"]


def test_script_renders_rewind_to_here_as_the_page_allows(admin):
    """Each refresh renders the action on the txids the server planned a rewind to (1-3
    committed, 4 the oldest uncommitted; 5 is after it), enabled or disabled as the page was
    rendered for the user, with what the dialog shows in its data-."""
    payload = admin.get("/transactions/api/pipelines/words").json()
    allowed = run_script("pipeline", payload, table={"rewindAllowed": "true"})["txids"]["html"]
    assert allowed.count('class="rewind"') == 4 and "disabled" not in allowed
    assert 'data-to="4"' in allowed and 'data-to="5"' not in allowed
    assert (
        'data-text="txids 2 … 5 will be recomputed, in order: the commits of txids 2 … 3 are '
        'undone, and txids 4 … 5, in flight, start over."'
    ) in allowed
    assert 'data-states="Every state of words goes back to its value after txid 1."' in allowed
    why = "rewinding needs the right to edit every DAG that runs this pipeline"
    denied = run_script("pipeline", payload, table={"rewindAllowed": "false", "rewindWhyNot": why})[
        "txids"
    ]["html"]
    assert denied.count(f'disabled="" title="{why}"') == 4


def test_script_renders_the_index_and_run_pages(admin):
    index = run_script("index", admin.get("/transactions/api/pipelines").json())
    assert index["pipelines"]["html"].count("<tr>") == 2
    assert 'href="/transactions/pipelines/words"' in index["pipelines"]["html"]
    run = run_script("run", admin.get("/transactions/api/pipelines/words/txids/4").json())
    assert run["attempts"]["html"].count("<tr>") == 2
    assert "attempt 2" in run["current"]["text"]
    assert SCRIPT not in run["attempts"]["html"] and "&lt;script&gt;" in run["attempts"]["html"]
    assert "processed" in run["current"]["text"]


def test_script_shows_a_failed_refresh_in_the_banner(db):
    dom = run_script("pipeline", {"detail": "the transaction log database is down"}, status=503)
    assert not dom["banner"]["hidden"]
    assert "503 the transaction log database is down" in dom["banner"]["text"]
    assert dom["stamp"]["text"] == "updated 00:00:00 UTC"  # the last good refresh


def test_state_summaries_are_read_once_per_commit(postgres):
    """Only a commit changes a state: the page's polls reuse the summary until the next one."""
    from airflow_txn_provider.ui.reader import state_summaries

    url = new_database(postgres)
    engine = create_engine(url)
    total = GlobalState("cached", "ui_cached_total", "transactional").create(engine)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {total.table} (value, txid) VALUES (10, 1)"))
    assert state_summaries(engine, "cached", 1)[0]["value"] == 10
    with engine.begin() as conn:  # (a commit would also move last_committed)
        conn.execute(text(f"UPDATE {total.table} SET value = 20"))
    assert state_summaries(engine, "cached", 1)[0]["value"] == 10  # same commit: not read again
    assert state_summaries(engine, "cached", 2)[0]["value"] == 20  # a new commit: read
    assert state_summaries(engine, "cached")[0]["value"] == 20  # no txid given: always read
    engine.dispose()
