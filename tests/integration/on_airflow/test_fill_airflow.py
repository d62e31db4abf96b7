"""An output added to a running pipeline with ``start="history"``, filled by its fill DAG on a
real Airflow (the shared deployment, ``tests/integration/conftest.py``), then applied by the live
txids; the Transactions page, in a real browser, shows the fill's progress, then that the output
is complete from txid 1.

``fill_words`` committed txids 1..30 (word counts) with the core API before the deployment
started; its DAG file (``tests/dags/txn_fill.py``) counts words. The test then does what a person
does: it edits the DAG file (creates the flag the file reads) to add ``fill_words_lengths`` with
``start="history"``. At its next parse ``build_dag`` also builds ``fill_words__fill``, unpaused at
creation: its task declares the output (live from txid 31), computes txids 1..30 on the session's
Spark Connect server one per step (``fill_chunk=1``), and joins, with no txid DAG run. Then the
txid DAG runs txids 31.. live, applying both outputs; both must equal their truth computed in
plain Python over every committed txid's lines.
"""

from __future__ import annotations

import re
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
FILLING = re.compile(r"filling: (\d+) % of history \(txids 1\.\.(\d+) of (\d+) committed\)")


def test_an_output_added_with_history_is_filled_by_its_fill_dag_watched_on_the_page(
    shared_airflow,
):
    stack = shared_airflow.stack
    api = stack.client()
    txlog = TransactionLog.from_url(shared_airflow.db_url, migrate=False)
    page_url = f"{stack.url}/transactions/pipelines/{FILL_PIPELINE}"
    (shared_airflow.folder / "fill-added").touch()  # the DAG file's edit
    api.wait_for_dag(FILL_DAG, timeout=240)
    assert api.call("GET", f"/dags/{FILL_DAG}")["is_paused"] is False  # unpaused at creation

    def lengths_fill():
        with txlog.engine.connect() as conn:
            rec = read_outputs(conn, FILL_PIPELINE).get(LENGTHS)
        return None if rec is None else rec.fill

    with chromium_page() as page, screenshot_on_failure(page, "fill-failure"):
        login(page, stack.url, ADMIN_USER, stack.password)

        # While it fills: the Outputs table says how far, with a progress bar
        def seen_filling():
            page.goto(page_url)
            row = page.locator("#outputs tr").filter(has_text=LENGTHS)
            if not row.count():  # not declared yet: the fill task declares it first
                return None
            found = FILLING.search(row.inner_text())
            if found is None or found.group(2) == "0":  # declared; its first step not done yet
                fill = lengths_fill()
                assert fill is None or fill.filling, "joined before the page showed it filling"
                return None
            share = float(row.locator("progress.fill").get_attribute("value") or "nan")
            card = page.locator(".state").filter(has_text=LENGTHS).inner_text()
            return found, share, card

        found, share, card = wait_until(
            seen_filling, 240, "the page to show the fill's progress", stack
        )
        percent, through, of = (int(g) for g in found.groups())
        # the state's figures move with the fill (not only at commits): what it applied so far
        keys = re.search(r"(\d+) keys", card)
        assert keys and int(keys.group(1)) > 0, card
        assert of == FILL_HISTORY and 0 < through < of, found.group(0)
        assert percent == int(100 * through / of) and share == pytest.approx(through / of)
        page.locator("#chart svg").wait_for()
        screenshot(page, "transactions-filling-output", full_page=True)

        fill = wait_until(
            lambda: (f := lengths_fill()) is not None and not f.filling and f,
            300,
            "the fill DAG to fill and join",
            stack,
        )
        assert (fill.live_from, fill.joined_after) == (FILL_HISTORY + 1, FILL_HISTORY)

        # its task's first run did it and ended; the next run waits (deferred) for another fill
        def first_run_done():
            return [r for r in api.runs(FILL_DAG) if r["state"] == "success"]

        done = wait_until(first_run_done, 120, "the fill DAG's first run to succeed", stack)
        [task] = api.task_instances(FILL_DAG, done[0]["dag_run_id"])
        assert task["task_id"] == "fill_from_history" and task["state"] == "success"

        with shared_airflow.running(FILL_PIPELINE):
            wait_until(
                lambda: txlog.last_committed(FILL_PIPELINE) >= FILL_HISTORY + 3,
                300,
                "three live txids after the join",
                stack,
            )
        shared_airflow.idle(FILL_DAG)  # its next run's deferred wait ends with the test

        # Then the page says it is complete from txid 1
        page.goto(page_url)
        row = page.locator("#outputs tr").filter(has_text=LENGTHS)
        row.wait_for()
        said = row.inner_text()
        assert (
            f"complete from txid 1 (filled from history, joined the live commits after txid "
            f"{FILL_HISTORY})" in said
        ), said
        screenshot(page, "transactions-filled-output", full_page=True)

    data = fill_lines()
    words, lengths = Counter(), Counter()
    committed = [t for t in txlog.transactions(FILL_PIPELINE) if t.status.value == "committed"]
    assert [t.txid for t in committed] == list(range(1, len(committed) + 1))
    for t in committed:
        for p, (a, b) in t.metadata.items():
            for line in data[p][a:b]:
                words.update(line.split())
                lengths[len(line)] += 1
    counts = MapState(FILL_PIPELINE, f"{FILL_PIPELINE}_counts", keys={"word": "text"})
    filled = MapState(FILL_PIPELINE, LENGTHS, "opaque", keys={"n": "bigint"})
    with txlog.engine.connect() as conn:
        assert {k[0]: v for k, v in counts.items(conn).items()} == dict(words)
        assert {k[0]: v for k, v in filled.items(conn).items()} == dict(lengths)
    txlog.engine.dispose()
