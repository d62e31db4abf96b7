"""Outputs added to and removed from a running pipeline, on a real Postgres log (issue 46).

The issue's case: a state ``a`` through txids 1-3, then ``b`` declared beside it, then txid 4.
It used to give ``a`` = 4 and ``b`` = 1 for the same key, with no error and nothing on the page
telling ``b`` apart. Now the declaration is refused unless it says how ``b`` starts; with
``start={"b": "next_txid"}`` the log records ``b`` complete from txid 4, and the Transactions
page (through the plugin's app) and the health endpoint say so. The same for a lake sink (a real
Delta table), and removals: refused unless ``retired=`` keeps or drops the tables.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text

from airflow_txn_provider.log import schema
from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.rules.exceptions import (
    OutputDeclarationError,
    OutputRemovedError,
    OutputStartRequiredError,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.sinks import DeltaSink, list_staged
from airflow_txn_provider.state import BucketCountState, MapState, load_states, stage_states
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app
from tests.conftest import new_database
from tests.integration.ui.plugin_client import plugin_client

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _clean_overrides():
    """``plugin_client`` stands in for Airflow's dependencies: they are Airflow's again after."""
    yield
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()


P = "p"
DAGS = {P: frozenset({"p_dag"})}


class Steps(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


class Everyone:
    """Stands for Airflow's auth manager: reads every DAG."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        return True

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return {"p_dag"}


def a_state():
    return MapState(P, "a", "transactional", keys={"key": "text"})


def b_state():
    return MapState(P, "b", "transactional", keys={"key": "text"})


def declare(txlog, states, sinks=(), **choices):
    return txlog.ensure_pipeline(
        P, source_kind="transactional", max_pending=4, states=states, sinks=sinks, **choices
    )


def process(txlog, txid, lake=(), rows=(("k", 1),)):
    """Begin ``txid`` and stage ``rows`` into every state registered now (as a job does, which
    reads the registry when it starts) and, as Parquet, for each lake sink."""
    e = txlog.begin(P, txid, Steps())
    assert e.emitted, e
    staged = {}
    for sink in lake:
        directory = sink.stage_dir(P, txid, e.attempt, "test")
        local = Path(directory.removeprefix("file://"))
        local.mkdir(parents=True)
        pq.write_table(
            pa.table({"key": [r[0] for r in rows], "n": [r[1] for r in rows]}),
            local / "part-0.parquet",
        )
        (local / "_SUCCESS").touch()
        staged[sink.output_key] = list_staged(directory).to_json()
    states = load_states(txlog.engine, P).values()

    def stage(conn):
        return {**stage_states(conn, txid, e.attempt, {s: list(rows) for s in states}), **staged}

    txlog.stage_output(P, txid, e.attempt, stage)
    return e


def run(txlog, txid, lake=()):
    e = process(txlog, txid, lake)
    assert commit_registered(txlog, P, txid, e.attempt, lake).applied


def values(txlog):
    with txlog.engine.connect() as conn:
        return {n: s.items(conn) for n, s in load_states(txlog.engine, P).items()}


def outputs(txlog):
    with txlog.engine.connect() as conn:
        return {n: (r.complete_from_txid, r.active) for n, r in read_outputs(conn, P).items()}


def table_exists(txlog, table):
    with txlog.engine.connect() as conn:
        return conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is not None


def commit_three(txlog):
    """The issue's start: ``a`` declared with the pipeline, txids 1-3 committed."""
    assert declare(txlog, [a_state()])
    for txid in (1, 2, 3):
        run(txlog, txid)
    assert outputs(txlog) == {"a": (1, True)}
    return txlog


@pytest.fixture
def three(txlog):
    return commit_three(txlog)


def test_a_state_added_to_a_running_pipeline_without_a_choice_is_refused_and_nothing_changes(
    three,
):
    txlog = three
    for _ in range(2):  # refused again: the declaration was not recorded as done
        with pytest.raises(OutputStartRequiredError) as err:
            declare(txlog, [a_state(), b_state()])
        assert err.value.pipeline == P and err.value.output == "b"
        message = str(err.value)
        assert "pipeline=p" in message and "'b'" in message and "txids 1..3" in message
        assert "start={'b': 'next_txid'}" in message and "complete from txid 4" in message
    assert set(load_states(txlog.engine, P)) == {"a"}
    assert not table_exists(txlog, "txn_state_b")
    assert outputs(txlog) == {"a": (1, True)}
    run(txlog, 4)  # the pipeline goes on as declared before
    assert values(txlog) == {"a": {("k",): 4}}


def test_a_state_started_at_the_next_txid_is_recorded_complete_from_it_and_shown_so(three):
    txlog = three
    assert declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})
    assert not declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})  # one read
    run(txlog, 4)
    assert values(txlog) == {"a": {("k",): 4}, "b": {("k",): 1}}
    assert outputs(txlog) == {"a": (1, True), "b": (4, True)}
    client = plugin_client(txlog, Everyone(), pipeline_dags=DAGS)

    page = client.get(f"/transactions/api/pipelines/{P}").json()
    said = {o["name"]: o for o in page["outputs"]}
    assert said["a"]["complete"] == "complete from txid 1" and said["a"]["partial"] is False
    assert said["b"]["complete"] == "complete from txid 4 (txids 1..3 are not in it)"
    assert said["b"]["partial"] is True and said["b"]["start"] == "next_txid"
    states = {s["name"]: s for s in page["states"]}
    assert states["b"]["complete"] == said["b"]["complete"] and states["b"]["sum"] == 1
    html = client.get(f"/transactions/pipelines/{P}").text
    assert "complete from txid 4 (txids 1..3 are not in it)" in html
    assert "complete from txid 1" in html

    health = client.get("/transactions/api/health").json()
    [mine] = health["pipelines"]
    got = {
        o["name"]: (o["complete_from_txid"], o["partial"], o["complete"]) for o in mine["outputs"]
    }
    assert got == {
        "a": (1, False, "complete from txid 1"),
        "b": (4, True, "complete from txid 4 (txids 1..3 are not in it)"),
    }
    one = client.get(f"/transactions/api/pipelines/{P}/health").json()
    assert [o["complete_from_txid"] for o in one["outputs"]] == [1, 4]


def test_txids_in_flight_when_a_state_is_added_are_never_applied_to_it(three):
    """Txid 4 began before ``b`` was declared: ``b`` starts at txid 5. Replayed afterwards (its
    job now stages into ``b`` too), txid 4 still does not reach ``b``: exactly from 5, no part
    of 4."""
    txlog = three
    first = process(txlog, 4)
    assert declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})
    assert outputs(txlog)["b"] == (5, True)
    txlog.fail(P, 4, first.attempt, error="lost")
    replay = txlog.begin_next(P, Steps())
    assert (replay.txid, replay.attempt) == (4, 2)

    def stage(conn):
        batches = {s: [("k", 1)] for s in load_states(txlog.engine, P).values()}
        return stage_states(conn, 4, replay.attempt, batches)

    txlog.stage_output(P, 4, replay.attempt, stage)
    result = commit_registered(txlog, P, 4, replay.attempt)
    assert result.details["b"] == {"skipped": "complete from txid 5"}
    assert values(txlog) == {"a": {("k",): 4}, "b": {}}
    run(txlog, 5)
    assert values(txlog) == {"a": {("k",): 5}, "b": {("k",): 1}}


def test_a_bucket_state_cannot_start_later_than_the_state_it_counts(three):
    buckets = BucketCountState(P, "a_buckets", "a", 10)
    with pytest.raises(OutputDeclarationError, match="counts the keys of 'a'") as err:
        declare(three, [a_state(), buckets], start={"a_buckets": "next_txid"})
    assert err.value.output == "a_buckets"
    assert set(load_states(three.engine, P)) == {"a"}


def test_a_lake_sink_added_to_a_running_pipeline(three, tmp_path, db_url):
    txlog = three
    sink = DeltaSink("events", table_uri=str(tmp_path / "lake" / "events"))
    with pytest.raises(OutputStartRequiredError, match="lake sink 'events'") as err:
        declare(txlog, [a_state()], [sink])
    assert err.value.output == "events"
    assert declare(txlog, [a_state()], [sink], start={"events": "next_txid"})
    assert outputs(txlog) == {"a": (1, True), "events": (4, True)}
    run(txlog, 4, [sink])
    table = sink.open(db_url)
    assert [t for t, _ in table.versions(P)] == [4]  # its first txid: 4, none before
    assert table.read(table.version_as_of(P, 4)).num_rows == 1
    client = plugin_client(txlog, Everyone(), pipeline_dags=DAGS)
    [health] = client.get("/transactions/api/health").json()["pipelines"]
    said = {o["name"]: o for o in health["outputs"]}
    assert said["events"]["kind"] == "lake_sink" and said["events"]["complete_from_txid"] == 4

    # removed: the provider never drops a lake table; kept, it is no longer committed into
    with pytest.raises(OutputRemovedError, match="'events'"):
        declare(txlog, [a_state()])
    with pytest.raises(OutputDeclarationError, match="never drops a lake table"):
        declare(txlog, [a_state()], retired={"events": "drop"})
    assert declare(txlog, [a_state()], retired={"events": "keep"})
    assert outputs(txlog)["events"] == (4, False)
    run(txlog, 5)
    assert [t for t, _ in sink.open(db_url).versions(P)] == [4]


def test_a_sink_never_declared_is_refused_at_a_later_txid_and_loses_nothing(three, tmp_path):
    """The core API commits into the sinks it is given: one never declared, given first at
    txid 4, would hold only txids from 4 on. Refused, and the txid is still there to commit."""
    txlog = three
    sink = DeltaSink("late", table_uri=str(tmp_path / "lake" / "late"))
    e = process(txlog, 4, [sink])
    with pytest.raises(OutputStartRequiredError, match="'late' was never declared") as err:
        commit_registered(txlog, P, 4, e.attempt, [sink])
    assert (err.value.pipeline, err.value.txid, err.value.output) == (P, 4, "late")
    assert txlog.last_committed(P) == 3 and values(txlog) == {"a": {("k",): 3}}


def test_the_migration_records_the_outputs_an_earlier_version_declared(postgres):
    """At 0010, ``old`` was registered with its state before any txid began, its sink wrote
    txid 1; ``late`` got a state after txid 1 had begun. From the log: ``old``'s outputs are
    complete from txid 1; when ``late``'s state started is not known: not recorded."""
    engine = create_engine(new_database(postgres, migrated=False))
    schema.upgrade(engine, "0010")
    with engine.begin() as conn:
        for name in ("old", "late"):
            conn.execute(
                text(
                    "INSERT INTO txn_pipeline (name, source_kind, max_pending, last_committed_txid)"
                    " VALUES (:n, 'transactional', 2, 1)"
                ),
                {"n": name},
            )
        conn.execute(
            text(
                "INSERT INTO txn_state_registry (name, pipeline, kind, definition, created_at) "
                "VALUES ('old_s', 'old', 'transactional', '{}', now() - interval '1 hour'),"
                " ('late_s', 'late', 'transactional', '{}', now())"
            )
        )
        for name, output in (("old", '{"lake:ev": {"rows": 1}}'), ("late", "{}")):
            conn.execute(
                text(
                    "INSERT INTO txn_transaction (pipeline, txid, attempt, status, output) "
                    "VALUES (:n, 1, 1, 'committed', CAST(:o AS jsonb))"
                ),
                {"n": name, "o": output},
            )
            conn.execute(
                text(
                    "INSERT INTO txn_attempt (pipeline, txid, attempt, status, started_at) "
                    "VALUES (:n, 1, 1, 'committed', now() - interval '10 minutes')"
                ),
                {"n": name},
            )
    schema.upgrade(engine)
    with engine.connect() as conn:
        found = {
            (p, n): (c.complete_from_txid, c.kind.value)
            for p in ("old", "late")
            for n, c in read_outputs(conn, p).items()
        }
    assert found == {
        ("old", "old_s"): (1, "state"),
        ("old", "ev"): (1, "lake_sink"),
        ("late", "late_s"): (None, "state"),
    }
    engine.dispose()


def test_a_state_filling_from_history_is_left_out_of_commits_and_shown_with_its_progress(three):
    """The page (HTML and its JSON) and the health endpoint say how far a fill got; the live
    commits leave the output out meanwhile, keeping its staged rows for the fill."""
    from airflow_txn_provider.log.fill_progress import advance, lock_fill, take_over

    txlog = three
    assert declare(txlog, [a_state(), b_state()], start={"b": "history"})
    run(txlog, 4)  # b's rows are staged by txid 4's processing, and not applied
    assert values(txlog) == {"a": {("k",): 4}, "b": {}}
    with txlog.engine.connect() as conn:
        assert b_state().staged_count(conn, 4, 1) == 1
    client = plugin_client(txlog, Everyone(), pipeline_dags=DAGS)

    def said():
        page = client.get(f"/transactions/api/pipelines/{P}").json()
        return {o["name"]: o for o in page["outputs"]}["b"]

    b = said()
    assert b["complete"] == "filling: 0 % of history (txids 1..0 of 4 committed)"
    assert b["filling"] is True and b["partial"] is True and b["start"] == "history"
    assert b["fill"] == {
        "live_from_txid": 4,
        "filled_through": 0,
        "share": 0.0,
        "joined_after_txid": None,
    }
    with txlog.engine.begin() as conn:  # a fill applied txids 1..2 (its rows, as the fill does)
        mine = take_over(conn, P, "b")
        advance(conn, P, lock_fill(conn, P, mine), 2)
    b = said()
    assert b["complete"] == "filling: 50 % of history (txids 1..2 of 4 committed)"
    html = client.get(f"/transactions/pipelines/{P}").text
    assert "filling: 50 % of history" in html
    assert '<progress class="fill" max="1" value="0.5">' in html
    [mine_health] = client.get("/transactions/api/health").json()["pipelines"]
    [b_health] = [o for o in mine_health["outputs"] if o["name"] == "b"]
    assert b_health["filling"] is True and b_health["fill"]["filled_through"] == 2
