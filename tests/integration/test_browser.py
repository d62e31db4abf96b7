"""Browser tests in headless Chromium against a real Airflow (scheduler with LocalExecutor,
dag-processor, triggerer, api-server; Postgres; Spark Connect; all on 127.0.0.1), running the
``example_txn_words`` DAG from ``dags/``: the deployment ``shared_airflow``
(``tests/integration/conftest.py``), which the credentials test uses too.

A person logs in, sees txid runs succeed in order in the grid, reads committed txids and the
state on the Transactions page, watches a txid fail until it stops the pipeline, presses
**Clear** on its run in the Airflow UI, and sees it and the later txids commit. Screenshots are
saved in ``test-artifacts/`` (``$TXN_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import re

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from airflow_txn_provider.exceptions import UnknownPipelineError
from airflow_txn_provider.transaction_log import TransactionLog
from tests.browser import chromium_page, login, screenshot, screenshot_on_failure
from tests.conftest import wait_until
from txn_testing.airflow import ADMIN_USER

DAG = "example_txn_words"
VARIABLE = f"txn_inject_failure__{DAG}"
WORDS_PER_LINE = 8  # GeneratedTextSource's default, which the example uses
RUN_ID = re.compile(r"txid-(\d{6})")


def _cells(page, rows: str) -> list[list[str]]:
    """The text of each cell of each row ``rows`` selects, read in one go: the pages refresh
    themselves, and a row-by-row read that crosses a refresh reads shifted rows (a new txid's
    row at the top pushed the oldest out of a read of the Transactions page once)."""
    return page.locator(rows).evaluate_all(
        "rows => rows.map(r => Array.from(r.querySelectorAll('td'), c => c.innerText.trim()))"
    )


def _runs_table(page) -> dict[int, str]:
    """txid -> state, as the DAG's Runs tab lists them (each row's whole text, read in one go)."""
    found = {}
    for text in page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.innerText)"):
        match = RUN_ID.search(text)
        if match:
            state = re.search(r"\b(Success|Failed|Running|Queued)\b", text)
            found[int(match.group(1))] = state.group(1) if state else "?"
    return found


def _card(page, label: str) -> int:
    card = page.locator("#summary .card").filter(has_text=label).first
    return int(card.locator(".v").inner_text())


def _txid_rows(page) -> dict[int, dict[str, str]]:
    rows = {}
    for cells in _cells(page, "#txids tr"):
        if len(cells) == 9:
            rows[int(cells[0])] = {
                "attempt": cells[1],
                "status": cells[2],
                "metadata": cells[3],
                "lake": cells[6],
                "error": cells[7],
            }
    return rows


def test_watch_commits_read_the_transactions_page_and_clear_a_failed_txid(shared_airflow):
    stack = shared_airflow.stack
    api = stack.client()
    api.wait_for_dag(DAG)
    log = TransactionLog.from_url(shared_airflow.db_url, migrate=False)
    with (
        chromium_page() as page,
        screenshot_on_failure(page, "failure"),
        shared_airflow.running(DAG),
    ):
        login(page, stack.url, ADMIN_USER, stack.password)
        # The pipeline is registered by its first txid's begin: unknown until then.
        wait_until(
            lambda: log.last_committed(DAG) >= 4, 300, "4 commits", stack, (UnknownPipelineError,)
        )

        # The Runs tab: a txid run turns Success only after its commit (when its failure sensor
        # ends, a moment later; the sensors of consecutive commits may end in either order), so
        # every Success run is a committed txid.
        def runs_tab():
            page.goto(f"{stack.url}/dags/{DAG}/runs")
            # any txid's row, not txid 1's: the tab lists the newest runs first, a page of
            # them, and a fast pipeline has pushed txid 1 to a later page
            page.locator("tbody tr").filter(has_text=RUN_ID).first.wait_for()
            # the rows as rendered now, not after "networkidle": while runs are active the tab
            # polls the api-server, and in the last clean-clone run the network never went
            # idle for 240 s while the page showed a screenful of Success runs
            runs = _runs_table(page)
            done = sorted(t for t, state in runs.items() if state == "Success")
            assert not done or done[-1] <= log.last_committed(DAG), runs
            assert "Failed" not in runs.values(), runs
            return len(done) >= 3

        # a page that has listed no txid within the locator's 30 s (a loaded machine) is
        # loaded again, within the 240 s, instead of failing the test
        wait_until(runs_tab, 240, "3 txid runs to show Success", stack, (PlaywrightTimeout,))
        screenshot(page, "airflow-runs")
        page.goto(f"{stack.url}/dags/{DAG}")
        page.get_by_text("watch_failures").first.wait_for()
        screenshot(page, "airflow-grid")

        # The Transactions page, through the Airflow nav (an iframe on the same origin).
        page.goto(stack.url)
        page.get_by_role("link", name=re.compile("Transactions")).first.click()
        frame = page.frame_locator("iframe").first
        frame.get_by_role("link", name=DAG).click()
        frame.locator("#txids tr").first.wait_for()

        # Then on its own, as a person reads it: committed txids are 1..L, L is the card's "last
        # committed", and the word-count state holds exactly words_per_line words per line of
        # the committed batches, whose offset ranges the page shows. Pipelines keep committing
        # while we read: a reading taken across a commit is read again.
        def transactions_page():
            page.goto(f"{stack.url}/transactions/pipelines/{DAG}")
            page.locator("#txids tr").first.wait_for()
            last = _card(page, "last committed")
            rows = _txid_rows(page)
            committed = sorted(t for t, r in rows.items() if r["status"] == "committed")
            assert last <= log.last_committed(DAG)
            if committed != list(range(1, last + 1)):  # card and rows read across a commit
                print("read again:", last, rows)
                return False
            lines = sum(
                end - start
                for t in committed
                for start, end in json.loads(rows[t]["metadata"]).values()
            )
            counts = page.locator(".state").filter(has_text=f"{DAG}_counts").inner_text()
            return f"sum {WORDS_PER_LINE * lines}" in counts and last >= 4

        wait_until(transactions_page, 60, "the Transactions page to match its committed batches")
        page.locator("#chart svg").wait_for()
        screenshot(page, "transactions-page", full_page=True)

        # A txid that fails on every attempt stops the pipeline (max_attempts 3).
        bad = max(t.txid for t in log.transactions(DAG)) + 3  # not begun yet
        api.set_variable(VARIABLE, f"{bad}:*")
        wait_until(
            lambda: (
                len(log.attempts(DAG, bad)) >= 3
                and all(a.status.value == "failed" for a in log.attempts(DAG, bad))
            ),
            400,
            f"txid {bad} to fail 3 times",
            stack,
        )
        run_id = f"txid-{bad:06d}"

        def note():
            found = [r for r in api.runs(DAG) if r["dag_run_id"] == run_id]
            return found and found[0].get("note")

        assert "POISON BATCH" in wait_until(note, 90, "the poison note on the run", stack)
        page.goto(f"{stack.url}/dags/{DAG}/runs/{run_id}")
        page.get_by_text("POISON BATCH").first.wait_for()
        screenshot(page, "airflow-poison-run")
        page.goto(f"{stack.url}/transactions/pipelines/{DAG}")
        page.locator("#txids tr").first.wait_for()
        failed = _txid_rows(page)[bad]
        assert failed["status"] == "failed" and "injected failure" in failed["error"]
        assert _card(page, "last committed") == bad - 1  # later txids wait behind it

        # The cause is removed; a person presses Clear on the txid's run in the Airflow UI.
        api.delete_variable(VARIABLE)
        page.goto(f"{stack.url}/dags/{DAG}/runs/{run_id}")
        page.get_by_role("button", name=re.compile("clear", re.I)).first.click()
        confirm = page.get_by_role("dialog").get_by_role("button", name=re.compile("confirm", re.I))
        confirm.wait_for()
        page.wait_for_timeout(500)  # the dialog's opening animation, for the screenshot
        screenshot(page, "airflow-clear-dialog")
        confirm.click()
        wait_until(
            lambda: log.last_committed(DAG) >= bad + 2, 300, "the cleared txids to commit", stack
        )

        # It and the later txids commit, in order; the page shows its attempts.
        page.goto(f"{stack.url}/transactions/pipelines/{DAG}/runs/{run_id}")
        page.get_by_text("committed").first.wait_for()
        history = page.locator("table").last.inner_text()
        assert history.count("failed") >= 3 and "committed" in history
        screenshot(page, "transactions-txid-attempts")
    txids = log.transactions(DAG)
    committed = [t for t in txids if t.status.value == "committed"]
    assert [t.txid for t in committed] == list(range(1, len(committed) + 1))
    times = [t.committed_at for t in committed]
    assert times == sorted(times)
    log.engine.dispose()
