"""The audit before each commit (issue 60) on the Transactions page, over a real Postgres log whose
outcomes and quarantined rows come from real commits (``commit_states`` with expectations): the
txid table's audit column, a txid's panel (its outcomes, its quarantined rows counted and
sampled), each expectation's trend, the JSON endpoints that carry the same, and a real browser
(Debian's headless Chromium) that renders them from the page's own refreshes. Every expected
figure is computed in plain Python from the batches, the rules applied by hand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine

from airflow_txn_provider import ExpectationsFailedError, RowCondition, RowCount
from airflow_txn_provider.log.expectations import (
    attempt_outcomes,
    committed_outcomes,
    quarantined_counts_of,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import audit
from tests.browser import chromium_page, screenshot, screenshot_on_failure
from tests.conftest import new_database
from tests.integration.ui.plugin_client import ReadsAll, plugin_client

P = "audited"
STATE = "audited_words"
MAX_ROWS = 40
POSITIVE = RowCondition(on=STATE, condition="delta > 0", name="positive")  # warn
NO_X = RowCondition(on=STATE, condition="word NOT LIKE 'x%'", action="drop", name="no x")
AT_MOST = RowCount(on=STATE, max=MAX_ROWS, action="fail", name=f"at most {MAX_ROWS} rows")
RULES = [POSITIVE, NO_X, AT_MOST]
# txid 1 passes everything; 2 warns and drops (more x-rows than the panel's sample); 3 warns,
# drops and has too many rows: a poison batch; 4 was in flight and fails with it.
BATCHES = {
    1: [("apple", 1), ("berry", 2), ("cherry", 3)],
    2: [("apple", 4), ("<script>", -1), ("date", 0)] + [(f"x{i:02d}", i + 1) for i in range(25)],
    3: [("elder", -2)] + [(f"xa{i}", 1) for i in range(3)] + [(f"w{i}", 1) for i in range(42)],
    4: [("fig", 1)],
}


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def failing(rule: RowCondition, rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The rows of ``rows`` that fail ``rule``, by hand."""
    checks = {"positive": lambda w, d: d > 0, "no x": lambda w, d: not w.startswith("x")}
    return [(w, d) for w, d in rows if not checks[rule.name](w, d)]


def truth(txid: int) -> dict[str, tuple[str, int, int]]:
    """Per expectation: (taken, rows checked, rows failed) for ``txid``'s batch."""
    rows = BATCHES[txid]
    found = {}
    for rule, on_failure in ((POSITIVE, "warned"), (NO_X, "dropped")):
        bad = len(failing(rule, rows))
        found[rule.name] = ("passed" if not bad else on_failure, len(rows), bad)
    found[AT_MOST.name] = ("passed" if len(rows) <= MAX_ROWS else "failed", len(rows), 0)
    return found


def summary_text(txid: int) -> str:
    """The audit column's words for ``txid``, from :func:`truth`."""
    t = truth(txid)
    by = {k: [n for n, v in t.items() if v[0] == k] for k in ("failed", "warned", "dropped")}
    parts = [f"failed: {', '.join(by['failed'])}"] if by["failed"] else []
    parts += [f"{len(by['warned'])} warned"] if by["warned"] else []
    dropped = sum(t[n][2] for n in by["dropped"])
    parts += [f"{len(by['dropped'])} dropped ({dropped} rows)"] if by["dropped"] else []
    passed = sum(v[0] == "passed" for v in t.values())
    return " · ".join(parts + ([f"{passed} passed"] if passed else []))


def stage(txlog: TransactionLog, words: MapState, txid: int, rows=None) -> int:
    """Begin ``txid`` and stage its batch (``rows``, else its own); returns the attempt."""
    attempt = txlog.begin(P, txid, Batches()).attempt
    rows = BATCHES[txid] if rows is None else rows
    txlog.stage_output(
        P, txid, attempt, lambda c: {words.output_key: words.stage(c, txid, attempt, rows)}
    )
    return attempt


@pytest.fixture(scope="module")
def audited(postgres) -> Iterator[TransactionLog]:
    """``audited``: txids 1 and 2 committed through the audit, 3 stopped by ``at most 40 rows``
    (after warning and dropping), 4 failed with it."""
    engine = create_engine(new_database(postgres))
    txlog = TransactionLog(engine, migrate=False)
    txlog.register_pipeline(P, source_kind="transactional", max_pending=4)
    words = MapState(P, STATE, keys={"word": "text"}).create(engine)
    attempts = {txid: stage(txlog, words, txid) for txid in BATCHES}
    for txid in (1, 2):
        commit_states(txlog, P, txid, attempts[txid], [words], expectations=RULES)
    with pytest.raises(ExpectationsFailedError):
        commit_states(txlog, P, 3, attempts[3], [words], expectations=RULES)
    assert txlog.transaction(P, 3).status is TxStatus.FAILED
    assert txlog.transaction(P, 4).failed_by == 3
    yield txlog
    engine.dispose()


@pytest.fixture
def client(audited):
    return plugin_client(audited, ReadsAll(), pipeline_dags={P: frozenset({P})})


def recorded(txlog: TransactionLog, txid: int) -> dict[str, dict]:
    """What the log recorded for ``txid``'s current attempt, by expectation."""
    return {o["expectation"]: o for o in txlog.attempts(P, txid)[-1].expectations}


# -- the log's reads -----------------------------------------------------------------------------


def test_the_log_reads_every_audited_attempt_and_a_txids_quarantine(audited):
    with audited.engine.connect() as conn:
        found = attempt_outcomes(conn, P, since_txid=0)
        assert [(t, a) for t, a, _ in found] == [(1, 1), (2, 1), (3, 1)]  # 4 never got judged
        assert [(t, a) for t, a, _ in attempt_outcomes(conn, P, since_txid=2)] == [(3, 1)]
        for txid, _, outcomes in found:
            got = {
                o["expectation"]: (o["taken"], o["rows_checked"], o["rows_failed"])
                for o in outcomes
            }
            assert got == truth(txid), txid
        assert quarantined_counts_of(conn, P, 2) == {STATE: len(failing(NO_X, BATCHES[2]))}
        assert quarantined_counts_of(conn, P, 3) == {}  # stopped: nothing of it quarantined
        assert quarantined_counts_of(conn, P, 1) == {}


# -- the pipeline: the audit column and each expectation's trend ------------------------------


def test_the_txid_table_summarises_each_txids_current_attempt(client):
    data = client.get(f"/transactions/api/pipelines/{P}").json()
    audit = {t["txid"]: t["audit"] for t in data["txids"]}
    assert {t: a["text"] for t, a in audit.items()} == {
        1: "3 passed",
        2: "1 warned · 1 dropped (25 rows) · 1 passed",
        3: f"failed: {AT_MOST.name} · 1 warned · 1 dropped (3 rows)",
        4: "",  # never judged: it failed with 3
    }
    assert {t: summary_text(t) for t in (1, 2, 3)} == {t: audit[t]["text"] for t in (1, 2, 3)}
    assert {t: a["level"] for t, a in audit.items()} == {
        1: "passed",
        2: "warned",
        3: "failed",
        4: "",
    }
    assert "positive on audited_words (warn): warned, 2 of 28 rows failed" in audit[2]["title"]


def test_each_expectations_trend_over_the_committed_txids(client, audited):
    x = client.get(f"/transactions/api/pipelines/{P}").json()["expectations"]
    assert x["committed_txids"] == 2
    trends = {t["expectation"]: t for t in x["trends"]}
    assert list(trends) == [r.name for r in RULES]
    for rule in RULES:
        t = trends[rule.name]
        want = [[txid, truth(txid)[rule.name][2]] for txid in (1, 2)]
        assert t["points"] == want, rule.name
        takens = [truth(txid)[rule.name][0] for txid in (1, 2)]
        counts = {k: takens.count(k) for k in ("passed", "warned", "dropped")}
        assert {k: t[k] for k in counts} == counts, rule.name
        assert (t["on"], t["action"], t["txids"]) == (STATE, str(rule.action), 2)
        assert t["max_failed"] == max(n for _, n in want)
        assert t["spark"] == audit.sparkline(want)
    with audited.engine.connect() as conn:  # what the log reads as the committed txids' trend
        logged = committed_outcomes(conn, P, 200)
    for rule in RULES:
        by_txid = [
            [t, *(o["rows_failed"] for o in found if o["expectation"] == rule.name)]
            for t, found in logged
        ]
        assert trends[rule.name]["points"] == by_txid
    # failed: listed txids whose attempt the fail expectation stopped (3), none committed
    assert {n: t["failed"] for n, t in trends.items()} == {
        "positive": 0,
        "no x": 0,
        AT_MOST.name: 1,
    }


def test_the_pipeline_page_renders_the_column_and_the_trend(client):
    html = client.get(f"/transactions/pipelines/{P}").text
    assert "<th>audit</th>" in html
    assert f'class="audit audit-failed" title="{AT_MOST.name} on' in html
    assert f"failed: {AT_MOST.name} · 1 warned · 1 dropped (3 rows)" in html
    assert html.count('<svg class="spark"') == 3
    assert f'<polyline points="{audit.sparkline([[1, 0], [2, 25]])}">' in html
    assert "newest 2 committed txids it judged" in html


# -- one txid: the panel ----------------------------------------------------------------------


def test_a_txids_panel_lists_its_outcomes_and_its_quarantined_rows(client, audited):
    data = client.get(f"/transactions/api/pipelines/{P}/txids/2").json()
    panel = data["audit"]
    assert panel["attempt"] == 1 and data["current"]["audit"]["text"] == summary_text(2)
    log = recorded(audited, 2)
    got = {o["expectation"]: o for o in panel["outcomes"]}
    assert list(got) == [r.name for r in RULES]  # in the order declared
    for name, (taken, checked, failed) in truth(2).items():
        o = got[name]
        assert (o["taken"], o["rows_checked"], o["rows_failed"]) == (taken, checked, failed)
        assert (o["on"], o["sample_keys"], o["message"]) == (
            STATE,
            *[log[name][k] for k in ("sample_keys", "message")],
        )
    assert set(got["positive"]["sample_keys"]) == {w for w, _ in failing(POSITIVE, BATCHES[2])}
    assert got["positive"]["message"] == "2 of 28 rows fail delta > 0: warned"
    dropped = failing(NO_X, BATCHES[2])
    assert (panel["quarantined"], panel["quarantined_by_output"]) == (25, {STATE: 25})
    sample = panel["quarantine"]
    assert len(sample) == audit.QUARANTINE_SAMPLE < len(dropped)
    assert {(r["row"]["word"], r["row"]["delta"]) for r in sample} < set(dropped)
    assert all(r["expectations"] == ["no x"] and r["attempt"] == 1 for r in sample)
    assert all(r["output"] == STATE for r in sample)


def test_a_stopped_txids_panel_names_the_failed_fail_and_quarantines_nothing(client):
    panel = client.get(f"/transactions/api/pipelines/{P}/txids/3").json()["audit"]
    assert {o["expectation"]: o["taken"] for o in panel["outcomes"]} == {
        n: v[0] for n, v in truth(3).items()
    }
    assert panel["summary"]["level"] == "failed"
    assert (panel["quarantined"], panel["quarantine"]) == (0, [])
    html = client.get(f"/transactions/pipelines/{P}/runs/txid-000003").text
    assert "46 rows, expected rows &lt;= 40: failed" in html
    assert "stops the whole txid, so nothing of it is committed or quarantined" in html
    untouched = client.get(f"/transactions/api/pipelines/{P}/txids/4").json()["audit"]
    assert (untouched["attempt"], untouched["outcomes"]) == (None, [])
    assert (
        "No expectation outcome is recorded"
        in client.get(f"/transactions/pipelines/{P}/runs/txid-000004").text
    )


def test_the_run_page_escapes_what_the_audit_recorded(client):
    html = client.get(f"/transactions/pipelines/{P}/runs/txid-000002").text
    assert "<script>" not in html  # the page's own script is <script src=...>
    assert "&lt;script&gt;" in html  # the warned row's key, a sample key
    assert "Quarantined rows: 25 (audited_words 25)" in html
    assert f"the first {audit.QUARANTINE_SAMPLE} of 25" in html


def test_a_rerun_txid_shows_its_newest_audited_attempt_until_the_new_one_is_judged(postgres):
    """After a fix a Clear reruns the stopped txid: while its new attempt processes, the panel
    shows the stopped attempt's outcomes (and says which), the column nothing; then the new one."""
    engine = create_engine(new_database(postgres))
    txlog = TransactionLog(engine, migrate=False)
    txlog.register_pipeline(P, source_kind="transactional", max_pending=2)
    words = MapState(P, STATE, keys={"word": "text"}).create(engine)
    client = plugin_client(txlog, ReadsAll(), pipeline_dags={P: frozenset({P})})
    first = stage(txlog, words, 1, BATCHES[3])  # too many rows
    with pytest.raises(ExpectationsFailedError):
        commit_states(txlog, P, 1, first, [words], expectations=RULES)
    second = stage(txlog, words, 1, BATCHES[3])  # the Clear, once the rule is fixed
    data = client.get(f"/transactions/api/pipelines/{P}/txids/1").json()
    assert (data["audit"]["attempt"], data["audit"]["summary"]["level"]) == (first, "failed")
    assert data["current"]["attempt"] == second and data["current"]["audit"]["text"] == ""
    assert [(a["attempt"], a["audit"]["level"]) for a in data["attempts"]] == [
        (second, ""),
        (first, "failed"),
    ]
    html = client.get(f"/transactions/pipelines/{P}/runs/txid-000001").text
    assert f"attempt {first}</span>" in html and f"failed: {AT_MOST.name}" in html
    fixed = [POSITIVE, NO_X, RowCount(on=STATE, max=MAX_ROWS, name=AT_MOST.name)]  # warns now
    commit_states(txlog, P, 1, second, [words], expectations=fixed)
    data = client.get(f"/transactions/api/pipelines/{P}/txids/1").json()
    assert data["audit"]["attempt"] == second
    assert data["current"]["audit"]["text"] == "2 warned · 1 dropped (3 rows)"
    assert data["audit"]["quarantined"] == len(failing(NO_X, BATCHES[3]))
    trends = client.get(f"/transactions/api/pipelines/{P}").json()["expectations"]["trends"]
    stopped = next(t for t in trends if t["expectation"] == AT_MOST.name)
    assert (stopped["points"], stopped["warned"], stopped["failed"]) == ([[1, 0]], 1, 1)
    engine.dispose()


# -- a real browser ---------------------------------------------------------------------------


def refreshed(page, container: str) -> None:
    """Empty ``container`` (rendered by the server) and wait for the page's script to fill it
    again from the JSON endpoint: what is read next is the script's rendering."""
    page.wait_for_function("() => document.getElementById('stamp') !== null")
    page.evaluate(f"document.getElementById('{container}').replaceChildren()")
    page.wait_for_function(
        f"() => document.getElementById('{container}').childElementCount > 0", timeout=20_000
    )


def cells(page, rows: str) -> list[list[str]]:
    return page.locator(rows).evaluate_all(
        "rows => rows.map(r => Array.from(r.querySelectorAll('td'), c => c.innerText.trim()))"
    )


def test_a_browser_renders_the_column_the_trend_and_the_panel(served, audited):
    errors: list[str] = []
    with chromium_page() as page:
        page.on("pageerror", lambda err: errors.append(str(err)))
        with screenshot_on_failure(page, "audit-view-failure"):
            page.goto(f"{served}/pipelines/{P}")
            refreshed(page, "txids")
            rows = {int(c[0]): c for c in cells(page, "#txids tr")}
            assert sorted(rows) == [1, 2, 3, 4]
            header = page.locator("#txid-table th").all_inner_texts()
            col = header.index("audit")
            assert {t: rows[t][col] for t in rows} == {
                t: summary_text(t) if t < 4 else "" for t in rows
            }
            failed_cell = page.locator("#txids tr").nth(1).locator(".audit")  # txid 3
            assert "audit-failed" in (failed_cell.get_attribute("class") or "")
            assert failed_cell.evaluate("e => getComputedStyle(e).fontWeight") == "600"

            refreshed(page, "trends")
            trend = {c[0]: c for c in cells(page, "#trends tr")}
            assert list(trend) == [r.name for r in RULES]
            for rule in RULES:
                warned = sum(truth(t)[rule.name][0] == "warned" for t in (1, 2))
                dropped = sum(truth(t)[rule.name][0] == "dropped" for t in (1, 2))
                failed = int(rule is AT_MOST)
                most = max(truth(t)[rule.name][2] for t in (1, 2))
                assert trend[rule.name][1:3] == [STATE, str(rule.action)]
                assert trend[rule.name][4:] == [
                    str(most),
                    "2",
                    str(2 - warned - dropped),
                    str(warned),
                    str(dropped),
                    str(failed),
                ]
            points = page.locator("#trends polyline").evaluate_all(
                "ps => ps.map(p => p.getAttribute('points'))"
            )
            assert points[1] == audit.sparkline([[1, 0], [2, 25]])
            box = page.locator("#trends svg.spark").first.bounding_box()
            assert box is not None and (box["width"], box["height"]) == (160, 28)
            screenshot(page, "transactions-audit-pipeline", full_page=True)

            for txid in (3, 2):
                page.goto(f"{served}/pipelines/{P}/runs/txid-{txid:06d}")
                refreshed(page, "audit")
                outcomes = {c[0]: c[1:] for c in cells(page, "#audit table:first-of-type tbody tr")}
                log = recorded(audited, txid)
                assert outcomes == {
                    name: [
                        STATE,
                        log[name]["action"],
                        taken.replace("_", " "),
                        str(checked),
                        str(failed),
                        ", ".join(log[name]["sample_keys"]),
                        log[name]["message"],
                    ]
                    for name, (taken, checked, failed) in truth(txid).items()
                }
                text = page.locator("#audit").inner_text()
                assert summary_text(txid) in text and "attempt 1" in text
                screenshot(page, f"transactions-audit-txid-{txid}", full_page=True)
            # txid 2: its quarantined rows, a bounded sample with the count
            text = page.locator("#audit").inner_text()
            assert "Quarantined rows: 25 (audited_words 25)" in text
            quarantined = cells(page, "#audit table:nth-of-type(2) tbody tr")
            assert len(quarantined) == audit.QUARANTINE_SAMPLE
            dropped_rows = {f'{{"delta":{d},"word":"{w}"}}' for w, d in failing(NO_X, BATCHES[2])}
            assert {r[3] for r in quarantined} <= dropped_rows
            assert {(r[0], r[1], r[2]) for r in quarantined} == {(STATE, "1", "no x")}
            assert f"the first {audit.QUARANTINE_SAMPLE} of 25" in text
            assert "<script>" in outcomes_text(page)  # a key shown as text, never markup
            assert page.locator("#audit script").count() == 0
            assert page.locator("#banner").is_hidden()
    assert errors == []


def outcomes_text(page) -> str:
    return page.locator("#audit table").first.inner_text()
