"""A pipeline's outputs in the log (log/outputs.py) on a real Postgres: the rows a declaration
writes, an unused output let go quietly, and a retired state's tables kept or dropped."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.rules.exceptions import OutputDeclarationError, OutputRemovedError
from airflow_txn_provider.state import load_states
from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import app as ui_app
from tests.integration.transactions.test_output_lifecycle import (
    DAGS,
    Everyone,
    P,
    a_state,
    b_state,
    commit_three,
    declare,
    outputs,
    run,
    table_exists,
    values,
)
from tests.integration.ui.plugin_client import plugin_client


@pytest.fixture(autouse=True)
def _clean_overrides():
    """``plugin_client`` stands in for Airflow's dependencies: they are Airflow's again after."""
    yield
    ui_app.app.dependency_overrides.clear()
    ui_access.provider.reset()


@pytest.fixture
def three(txlog):
    return commit_three(txlog)  # ``a`` declared with the pipeline, txids 1-3 committed


def test_a_new_pipeline_needs_no_choice_and_an_unused_output_goes_quietly(txlog):
    assert declare(txlog, [a_state(), b_state()])
    assert outputs(txlog) == {"a": (1, True), "b": (1, True)}
    assert declare(txlog, [a_state()])  # b held nothing: let go, its empty tables dropped
    assert outputs(txlog) == {"a": (1, True), "b": (1, False)}
    assert not table_exists(txlog, "txn_state_b")
    run(txlog, 1)
    assert declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})  # back, from 2
    assert outputs(txlog) == {"a": (1, True), "b": (2, True)}


def test_a_removed_state_holding_txids_needs_keep_or_drop(three):
    txlog = three
    assert declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})
    run(txlog, 4)
    with pytest.raises(OutputRemovedError) as err:
        declare(txlog, [a_state()])
    assert err.value.output == "b" and "retired={'b': 'keep'}" in str(err.value)
    assert set(load_states(txlog.engine, P)) == {"a", "b"}  # nothing changed

    assert declare(txlog, [a_state()], retired={"b": "keep"})
    assert set(load_states(txlog.engine, P)) == {"a"}  # no longer applied
    with txlog.engine.connect() as conn:
        assert conn.execute(text("SELECT key, value FROM txn_state_b")).all() == [("k", 1)]
        b = read_outputs(conn, P)["b"]
    assert (b.retired_after_txid, b.retirement.value) == (4, "keep")
    run(txlog, 5)
    assert values(txlog) == {"a": {("k",): 5}}
    client = plugin_client(txlog, Everyone(), pipeline_dags=DAGS)
    said = {o["name"]: o for o in client.get(f"/transactions/api/pipelines/{P}").json()["outputs"]}
    assert said["b"]["complete"] == (
        "retired after txid 4 (tables kept); was complete from txid 4 (txids 1..3 are not in it)"
    )
    with pytest.raises(OutputDeclarationError, match="tables kept"):  # its old rows are there
        declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})

    assert _reads_as_of(txlog, "b")
    assert declare(txlog, [a_state()], retired={"b": "drop"})
    assert not table_exists(txlog, "txn_state_b")
    assert not _reads_as_of(txlog, "b")  # its as-of SQL function went with its tables
    assert declare(txlog, [a_state(), b_state()], start={"b": "next_txid"})
    assert outputs(txlog)["b"] == (6, True)


def _reads_as_of(txlog, state):
    with txlog.engine.connect() as conn:
        found = conn.execute(
            text("SELECT to_regprocedure(:f)"), {"f": f"txn_as_of_{state}(bigint)"}
        )
        return found.scalar() is not None
