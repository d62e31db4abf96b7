"""The commit task's OpenLineage on a real log (issue 60): each txid's audit, as ``commit_states``
recorded it in Postgres, is the spec's ``dataQualityAssertions`` on the audited state's table,
schema-valid, its assertions matching ground truth computed in plain Python from the batches; a
txid a ``fail`` expectation stopped names its failed assertion from its failed commit task."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde
from sqlalchemy import text
from sqlalchemy.engine import make_url

from airflow_txn_provider import ExpectationsFailedError, RowCondition, RowCount
from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.utils.lineage import PRODUCER, QUALITY_FACET, SCHEMAS
from tests.conftest import set_txn_log_connection
from txn_testing.openlineage import spec_schemas

SEED = 6061
WORDS = ["apple", "berry", "xenon", "xylo", "date"]
MAX_ROWS = 6  # the fail expectation's bound; the last txid stages more


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _event(lineage: Any, kind: RunState) -> dict[str, Any]:
    event = RunEvent(
        eventType=kind,
        eventTime="2026-01-01T00:00:00+00:00",
        run=Run(runId="01950000-0000-7000-8000-000000000000", facets=lineage.run_facets),
        job=Job(namespace="default", name="lineage_audit.commit"),
        producer=PRODUCER,
        inputs=lineage.inputs,
        outputs=lineage.outputs,
    )
    return json.loads(Serde.to_json(event))


def _truth(rows: list[tuple[str, int]]) -> dict[str, tuple[bool, int]]:
    """Per expectation: whether the batch met it, and its failing rows (plain Python)."""
    x = sum(w.startswith("x") for w, _ in rows)
    debts = sum(d <= 0 for _, d in rows)
    return {
        "no x": (x == 0, x),
        "positive": (debts == 0, debts),
        "small": (len(rows) <= MAX_ROWS, 0),
    }


def test_the_commit_names_each_txids_audit_as_recorded_in_the_log(txlog, db_url, monkeypatch):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    p = "lineage_audit"
    set_txn_log_connection(monkeypatch, "lineage_txn_log", db_url)
    txlog.register_pipeline(p, source_kind="transactional", max_pending=8)
    words = MapState(p, f"{p}_w", keys={"word": "text"}).create(txlog.engine)
    expectations = [
        RowCondition(on=words.name, condition="word NOT LIKE 'x%'", action="drop", name="no x"),
        RowCondition(on=words.name, condition="delta > 0", name="positive"),  # warn
        RowCount(on=words.name, max=MAX_ROWS, action="fail", name="small"),
    ]
    txn_pipeline = TxnPipeline(
        name=p,
        source=PartitionedParquetSource("/data/words"),
        jobs=["spark_jobs/word_count.py"],
        states=[words],
        expectations=expectations,
        txn_log_conn_id="lineage_txn_log",
    )
    commit = build_dag(txn_pipeline).get_task("commit")
    schemas = spec_schemas(SCHEMAS)
    url = make_url(db_url)
    table = (f"postgres://{url.host}:{url.port}", f"{url.database}.public.{words.table}")
    with txlog.engine.connect() as conn:  # the dataset named is the state's table, there
        assert conn.execute(text("SELECT to_regclass(:t)"), {"t": words.table}).scalar()

    sizes = [rng.randint(1, MAX_ROWS) for _ in range(4)] + [MAX_ROWS + 3]  # the last stops
    batches = [[(rng.choice(WORDS), rng.randint(-1, 5)) for _ in range(n)] for n in sizes]
    met = set()
    for txid, rows in enumerate(batches, start=1):
        attempt = txlog.begin(p, txid, Batches()).attempt
        txlog.stage_output(
            p,
            txid,
            attempt,
            lambda c, t=txid, a=attempt, r=rows: {words.output_key: words.stage(c, t, a, r)},
        )
        commit._lineage_claim = {"txid": txid, "attempt": attempt, "metadata": {"txid": txid}}
        truth = _truth(rows)
        if truth["small"][0]:
            commit_states(txlog, p, txid, attempt, [words], expectations=expectations)
            event = _event(commit.get_openlineage_facets_on_complete(None), RunState.COMPLETE)
            assert [(o["namespace"], o["name"]) for o in event["outputs"]] == [table]
        else:
            with pytest.raises(ExpectationsFailedError):
                commit_states(txlog, p, txid, attempt, [words], expectations=expectations)
            event = _event(commit.get_openlineage_facets_on_failure(None), RunState.FAIL)
            assert event["outputs"] == []  # nothing committed
        assert schemas.problems(event) == []
        [state] = event["inputs"]
        assert (state["namespace"], state["name"]) == table
        got = {
            a["assertion"]: (a["success"], a["params"]["rows_failed"], a["params"]["rows_checked"])
            for a in state["inputFacets"][QUALITY_FACET]["assertions"]
        }
        assert got == {name: (ok, n, len(rows)) for name, (ok, n) in truth.items()}
        met |= {(name, ok) for name, (ok, _) in truth.items()}
    # every expectation was seen met and not met (the seed's batches)
    assert met == {(name, ok) for name in ("no x", "positive", "small") for ok in (True, False)}
