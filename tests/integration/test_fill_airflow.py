"""An output added to a running pipeline with ``start="history"``, filled by its fill DAG on a
real Airflow (the shared deployment, ``tests/integration/conftest.py``), then applied by the live
txids; the Transactions page, in a real browser, says it is complete from txid 1.

``fill_words`` committed txids 1..6 (word counts) with the core API before its DAG file was
parsed; the DAG file (``tests/dags/txn_fill.py``) adds ``fill_words_lengths`` with
``start="history"``. ``build_dag`` built ``fill_words__fill`` beside the txid DAG, unpaused at
creation: its task declared the output (live from txid 7), computed txids 1..6 on the session's
Spark Connect server and joined, without a txid DAG run. Then the txid DAG runs txids 7.. live,
applying both outputs; both must equal their truth computed in plain Python over every committed
txid's lines.
"""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.browser import chromium_page, login, screenshot, screenshot_on_failure
from tests.conftest import wait_until
from tests.integration.conftest import FILL_HISTORY, FILL_PIPELINE, fill_lines
from txn_testing.airflow import ADMIN_USER

pytestmark = pytest.mark.integration

FILL_DAG = f"{FILL_PIPELINE}__fill"
LENGTHS = f"{FILL_PIPELINE}_lengths"


def test_the_fill_dag_fills_an_added_output_and_the_live_txids_apply_it(shared_airflow):
    stack = shared_airflow.stack
    api = stack.client()
    log = TransactionLog.from_url(shared_airflow.db_url, migrate=False)
    api.wait_for_dag(FILL_DAG)
    assert api.call("GET", f"/dags/{FILL_DAG}")["is_paused"] is False  # unpaused at creation

    def joined():
        with log.engine.connect() as conn:
            rec = read_outputs(conn, FILL_PIPELINE).get(LENGTHS)
        return rec is not None and rec.fill is not None and rec.fill.joined_after

    assert wait_until(joined, 300, "the fill DAG to fill and join", stack) == FILL_HISTORY
    with log.engine.connect() as conn:
        rec = read_outputs(conn, FILL_PIPELINE)[LENGTHS]
    assert rec.fill.live_from == FILL_HISTORY + 1
    # its task's first run did it, and ended; the next run waits (deferred) for another fill
    def first_run_done():
        return [r for r in api.runs(FILL_DAG) if r["state"] == "success"]

    done = wait_until(first_run_done, 120, "the fill DAG's first run to succeed", stack)
    [task] = api.task_instances(FILL_DAG, done[0]["dag_run_id"])
    assert task["task_id"] == "fill_from_history" and task["state"] == "success"

    with shared_airflow.running(FILL_PIPELINE):
        wait_until(
            lambda: log.last_committed(FILL_PIPELINE) >= FILL_HISTORY + 3,
            300,
            "three live txids after the join",
            stack,
        )
    shared_airflow.idle(FILL_DAG)  # its next run's deferred wait ends with the test

    data = fill_lines()
    words, lengths = Counter(), Counter()
    committed = [t for t in log.transactions(FILL_PIPELINE) if t.status.value == "committed"]
    for t in committed:
        for p, (a, b) in t.metadata.items():
            for line in data[p][a:b]:
                words.update(line.split())
                lengths[len(line)] += 1
    counts = MapState(FILL_PIPELINE, f"{FILL_PIPELINE}_counts", keys={"word": "text"})
    filled = MapState(FILL_PIPELINE, LENGTHS, "opaque", keys={"n": "bigint"})
    with log.engine.connect() as conn:
        assert {k[0]: v for k, v in counts.items(conn).items()} == dict(words)
        assert {k[0]: v for k, v in filled.items(conn).items()} == dict(lengths)

    # The Transactions page, as a person reads it: the output is complete from txid 1
    with chromium_page() as page, screenshot_on_failure(page, "fill-failure"):
        login(page, stack.url, ADMIN_USER, stack.password)
        page.goto(f"{stack.url}/transactions/pipelines/{FILL_PIPELINE}")
        row = page.locator("#outputs tr").filter(has_text=LENGTHS)
        row.wait_for()
        said = row.inner_text()
        assert (
            f"complete from txid 1 (filled from history, joined the live commits after txid "
            f"{FILL_HISTORY})" in said
        ), said
        screenshot(page, "transactions-filled-output", full_page=True)
    log.engine.dispose()
