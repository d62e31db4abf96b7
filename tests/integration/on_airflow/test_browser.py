"""Browser tests in headless Chromium against a real Airflow (scheduler with LocalExecutor,
dag-processor, triggerer, api-server; Postgres; Spark Connect; all on 127.0.0.1), running the
``example_txn_words`` DAG from ``dags/``: the deployment ``shared_airflow``
(``tests/integration/conftest.py``), which the credentials test uses too.

A person logs in, sees txid runs succeed in order in the grid, reads committed txids and the
state on the Transactions page, watches a txid fail until it stops the pipeline, presses
**Clear** on its run in the Airflow UI, and sees it and the later txids commit. Then the admin
presses **Rewind to here** on a committed txid N, reads in the confirmation which txids are
recomputed, confirms, and the log records the rewind and recommits N with a new attempt; a
viewer, who may not edit the DAG, sees the action disabled and is refused the same request.
Screenshots are saved in ``test-artifacts/`` (``$TXN_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import sqlalchemy as sa
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.models import REWINDS
from airflow_txn_provider.rules.exceptions import UnknownPipelineError
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui.actions import NOT_AN_EDITOR
from tests.browser import chromium_page, login, screenshot, screenshot_on_failure
from tests.conftest import wait_until
from tests.integration.conftest import VIEWER_PASSWORD, VIEWER_USER
from txn_testing.airflow import ADMIN_USER

DAG = "example_txn_words"
VARIABLE = f"txn_inject_failure__{DAG}"
WORDS_PER_LINE = 8  # GeneratedTextSource's default, which the example uses
RUN_ID = re.compile(r"txid-(\d{6})")
REASON = "word_count.py fixed: count again from here"
POST_REWIND = """async ([url, to]) => {
  const response = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: { Accept: "application/json", "Content-Type": "application/json" },
    body: JSON.stringify({ to_txid: to }),
  });
  return [response.status, await response.json()];
}"""
"""The rewind request as the page's script sends it, from a signed-in user's browser."""


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
        if len(cells) == 11:
            rows[int(cells[0])] = {
                "attempt": cells[1],
                "status": cells[2],
                "metadata": cells[3],
                "lake": cells[6],
                "error": cells[7],
            }
    return rows


def _rewinds(txlog: TransactionLog) -> list:
    """The pipeline's rewinds as the log records them (``txn_rewind``), oldest first."""
    with txlog.engine.connect() as conn:
        query = sa.select(REWINDS).where(REWINDS.c.pipeline == DAG).order_by(REWINDS.c.id)
        return list(conn.execute(query))


def _counts_match_the_committed_batches(txlog: TransactionLog) -> bool:
    """The word counts hold exactly ``WORDS_PER_LINE`` words per line of the committed batches
    (read in one snapshot: a commit between two reads would tell nothing)."""
    counts = MapState(DAG, f"{DAG}_counts", "transactional", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        batches = conn.execute(
            sa.text("SELECT metadata FROM txn_transaction WHERE pipeline = :p AND status = :s"),
            {"p": DAG, "s": TxStatus.COMMITTED.value},
        ).scalars()
        lines = sum(end - start for batch in batches for start, end in batch.values())
        words = sum(counts.items(conn).values())
        conn.rollback()
    return bool(words == WORDS_PER_LINE * lines)


def test_watch_commits_read_the_transactions_page_and_clear_a_failed_txid(shared_airflow):
    stack = shared_airflow.stack
    api = stack.client()
    api.wait_for_dag(DAG)
    txlog = TransactionLog.from_url(shared_airflow.db_url, migrate=False)
    with (
        chromium_page() as page,
        screenshot_on_failure(page, "failure"),
        shared_airflow.running(DAG),
    ):
        login(page, stack.url, ADMIN_USER, stack.password)
        # The pipeline is registered by its first txid's begin: unknown until then.
        wait_until(
            lambda: txlog.last_committed(DAG) >= 4, 300, "4 commits", stack, (UnknownPipelineError,)
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
            assert not done or done[-1] <= txlog.last_committed(DAG), runs
            assert "Failed" not in runs.values(), runs
            return len(done) >= 3

        # a page that has listed no txid within the locator's 30 s (a loaded machine) is
        # loaded again, within the 240 s, instead of failing the test
        wait_until(runs_tab, 240, "3 txid runs to show Success", stack, (PlaywrightTimeout,))
        screenshot(page, "airflow-runs")
        page.goto(f"{stack.url}/dags/{DAG}")
        page.get_by_text("watch_failures").first.wait_for()
        # The DAG header says when the latest txid's run was due (its run_after), not the
        # txid-encoding logical date of the year 2000 (issue 30).
        days = {(datetime.now(UTC) - timedelta(days=d)).strftime("%Y-%m-%d") for d in (0, 1)}

        def latest_run_day() -> str | None:
            found = re.search(r"Latest Run\s+(\d{4}-\d{2}-\d{2})", page.inner_text("body"))
            return found.group(1) if found else None

        wait_until(lambda: latest_run_day() is not None, 60, "the DAG header's latest run", stack)
        assert latest_run_day() in days, (latest_run_day(), days)
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
            assert last <= txlog.last_committed(DAG)
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
        bad = max(t.txid for t in txlog.transactions(DAG)) + 3  # not begun yet
        api.set_variable(VARIABLE, f"{bad}:*")
        wait_until(
            lambda: (
                len(txlog.attempts(DAG, bad)) >= 3
                and all(a.status.value == "failed" for a in txlog.attempts(DAG, bad))
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
            lambda: txlog.last_committed(DAG) >= bad + 2, 300, "the cleared txids to commit", stack
        )

        # It and the later txids commit, in order; the page shows its attempts.
        page.goto(f"{stack.url}/transactions/pipelines/{DAG}/runs/{run_id}")
        page.get_by_text("committed").first.wait_for()
        history = page.locator("table").last.inner_text()
        assert history.count("failed") >= 3 and "committed" in history
        screenshot(page, "transactions-txid-attempts")

        # Rewind to here, as the admin, on a committed txid N: the confirmation names the
        # pipeline, the txids recomputed (N … M: N's commit and every later one undone, the txids
        # in flight started over) and the txid the states go back to; its answer says what is
        # pending again. The log records the rewind and recommits N with a new attempt.
        last = txlog.last_committed(DAG)  # before the page: the page's M is at least this
        to = last - 2
        attempt_before = txlog.transaction(DAG, to).attempt
        page.goto(f"{stack.url}/transactions/pipelines/{DAG}")
        page.locator(f'button.rewind[data-to="{to}"]').click()
        dialog = page.locator("#rewind-dialog")
        dialog.wait_for()
        said = dialog.inner_text()
        planned = re.search(rf"txids {to} … (\d+) will be recomputed", said)
        assert planned, said
        through = int(planned.group(1))
        assert through >= last, said
        assert f"the commits of txids {to} … " in said, said
        assert f"Rewind {DAG} to txid {to}?" in said, said
        assert f"Every state of {DAG} goes back to its value after txid {to - 1}." in said, said
        page.locator("#rewind-reason").fill(REASON)
        screenshot(page, "transactions-rewind-dialog")
        page.locator("#rewind-confirm").click()
        page.wait_for_function(
            "() => { const r = document.getElementById('rewind-result');"
            " return !r.hidden && !r.textContent.startsWith('Rewinding'); }",
            timeout=120_000,
        )
        answer = page.locator("#rewind-result").inner_text()
        assert answer.startswith(f"Rewound {DAG} to txid {to}") and "pending again" in answer
        assert f"txids {to} … " in answer, answer

        [rewind] = _rewinds(txlog)
        assert (rewind.to_txid, rewind.by, rewind.reason) == (to, ADMIN_USER, REASON)
        assert rewind.last_committed_txid >= last
        assert to + rewind.rewound_txids - 1 >= through  # at least what the dialog named
        now_last, info = txlog.last_committed(DAG), txlog.transaction(DAG, to)
        if now_last < to:  # rewound, N not recommitted yet
            assert now_last == to - 1 and info.attempt >= attempt_before, (now_last, info)
        else:  # recommitted already, by a new attempt
            assert info.status is TxStatus.COMMITTED and info.attempt > attempt_before, info
        events = api.call("GET", "/eventLogs", params={"event": "txn_rewind", "dag_id": DAG})
        assert [(e["dag_id"], e["owner"]) for e in events["event_logs"]] == [(DAG, ADMIN_USER)]

        # A viewer may read the DAG but not edit it: the action is disabled and says why, and the
        # same request from their session is refused (403) and changes nothing in the log.
        viewing = page.context.browser.new_context(viewport={"width": 1600, "height": 1000})
        try:
            viewer = viewing.new_page()
            viewer.set_default_timeout(30_000)
            login(viewer, stack.url, VIEWER_USER, VIEWER_PASSWORD)
            viewer.goto(f"{stack.url}/transactions/pipelines/{DAG}")
            viewer.locator("button.rewind").first.wait_for()
            buttons = viewer.locator("button.rewind").evaluate_all(
                "bs => bs.map(b => [b.disabled, b.title])"
            )
            assert buttons and all(off and why == NOT_AN_EDITOR for off, why in buttons), buttons
            # The page re-renders its table every few seconds: a button can be replaced between
            # being found and clicked ("not visible", seen in CI); click a fresh one again.
            for last_try in (False, False, True):
                try:
                    viewer.locator("button.rewind").first.click(force=True, timeout=10_000)
                    break
                except PlaywrightError:
                    if last_try:
                        raise
            assert not viewer.locator("#rewind-dialog").is_visible()
            url = f"{stack.url}/transactions/api/pipelines/{DAG}/rewind"
            status, body = viewer.evaluate(POST_REWIND, [url, to])
            assert status == 403 and NOT_AN_EDITOR in body["detail"], (status, body)
        finally:
            viewing.close()
        assert [r.id for r in _rewinds(txlog)] == [rewind.id]
        events = api.call("GET", "/eventLogs", params={"event": "txn_rewind", "dag_id": DAG})
        assert len(events["event_logs"]) == 1

        # The pipeline heals: N and the txids after it commit again, N with a new attempt.
        def recomputed() -> bool:
            info = txlog.transaction(DAG, to)
            return (
                txlog.last_committed(DAG) >= through
                and info.status is TxStatus.COMMITTED
                and info.attempt > attempt_before
            )

        wait_until(recomputed, 300, f"txids {to}..{through} recomputed after the rewind", stack)
    txids = txlog.transactions(DAG)
    committed = [t for t in txids if t.status.value == "committed"]
    assert [t.txid for t in committed] == list(range(1, len(committed) + 1))
    times = [t.committed_at for t in committed]
    assert times == sorted(times)
    # Exactly once through the rewind: the states back as after N - 1, then N… counted again.
    wait_until(lambda: _counts_match_the_committed_batches(txlog), 30, "counts = batches")
    txlog.engine.dispose()
