"""A state's past on the Transactions page (issue 61), over a real Postgres log whose states come
from real commits (``commit_states``): what a txid changed (its page and its endpoint), a key's
history and a state as of a txid (their endpoints, the page's forms), refused beyond retention.
Two pipelines commit the same batches: one keeps every txid, the other only its newest few, so
its older txids are refused. Every expected figure is the fold of the batches in plain Python;
a real browser (Debian's headless Chromium) types a key and a txid into a state card and reads
the answers the page shows.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import create_engine

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import GlobalState, MapState, stage_states
from airflow_txn_provider.state.as_of import as_of_floor
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import state_reads
from tests.browser import chromium_page, screenshot, screenshot_on_failure
from tests.conftest import new_database
from tests.integration.ui.plugin_client import ReadsAll, plugin_client

pytestmark = pytest.mark.integration

KEPT, PRUNED = "reads_kept", "reads_pruned"
KEEP = 4
"""The pruned pipeline keeps its newest ``KEEP`` committed txids."""
LAST = 8
REGIONS = ["eu", "us", "<i>ap</i>"]
BULK = 25
"""Txid 3 adds this many new keys, each by a different amount: more than a txid's page shows."""
FAILED_FIRST = 5
"""Txid 5's first attempt fails; its second commits."""

Rows = list[tuple[str, int, int]]


def batch(txid: int) -> Rows:
    """Txid ``txid``'s ``(area, slot, delta)`` rows (the same in both pipelines)."""
    if txid == 3:
        return [("bulk", i, i + 1) for i in range(BULK)]
    rng = random.Random(txid * 61)
    return [(rng.choice(REGIONS), rng.randint(1, 3), rng.randint(-4, 9)) for _ in range(5)]


def total_delta(txid: int) -> int:
    return txid * 10 - 35


@dataclass
class Truth:
    """Each state's value after every committed txid, the keys each txid touched and the attempt
    that committed it: folded from the batches in plain Python."""

    after: list[dict[str, dict[tuple, int]]] = field(
        default_factory=lambda: [{"counts": {}, "total": {}}]
    )
    touched: list[dict[str, set[tuple]]] = field(default_factory=lambda: [{}])
    attempts: list[int] = field(default_factory=lambda: [0])

    def commit(self, rows: Rows, total: int, attempt: int) -> None:
        deltas: Counter[tuple] = Counter()
        for region, n, delta in rows:
            deltas[(region, n)] += delta
        counts = dict(self.after[-1]["counts"])
        for key, delta in deltas.items():
            counts[key] = counts.get(key, 0) + delta
        whole = {(True,): self.after[-1]["total"].get((True,), 0) + total}
        self.after.append({"counts": counts, "total": whole})
        self.touched.append({"counts": set(deltas), "total": {(True,)}})
        self.attempts.append(attempt)


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


@dataclass
class Built:
    txlog: TransactionLog
    counts: dict[str, MapState]
    totals: dict[str, GlobalState]
    truth: Truth
    floor: dict[str, int]
    """The oldest txid each pipeline's states can be read as of."""


def stage(txlog, pipeline, counts, total, txid, rows, delta) -> int:
    attempt = txlog.begin(pipeline, txid, Batches()).attempt
    txlog.stage_output(
        pipeline,
        txid,
        attempt,
        lambda conn: stage_states(conn, txid, attempt, {counts: rows, total: [(delta,)]}),
    )
    return attempt


@pytest.fixture(scope="module")
def built(postgres) -> Iterator[Built]:
    """Both pipelines with txids 1..8 committed (5 after a failed attempt), the kept one with
    txid 9 in flight; the pruned one pruned to its newest ``KEEP``."""
    engine = create_engine(new_database(postgres))
    txlog = TransactionLog(engine, migrate=False)
    truth = Truth()
    counts, totals = {}, {}
    for pipeline, keep in ((KEPT, 1000), (PRUNED, KEEP)):
        txlog.register_pipeline(
            pipeline, source_kind="transactional", max_pending=2, keep_txids=keep
        )
        keys = {"area": "text", "slot": "integer"}  # the order a jsonb definition keeps
        counts[pipeline] = MapState(pipeline, f"{pipeline}_counts", keys=keys).create(engine)
        totals[pipeline] = GlobalState(pipeline, f"{pipeline}_total", "opaque").create(engine)
        states = (counts[pipeline], totals[pipeline])
        for txid in range(1, LAST + 1):
            if txid == FAILED_FIRST:
                first = stage(txlog, pipeline, *states, txid, [("eu", 1, 1000)], 1000)
                txlog.fail(pipeline, txid, first, error="injected")
            attempt = stage(txlog, pipeline, *states, txid, batch(txid), total_delta(txid))
            commit_states(txlog, pipeline, txid, attempt, list(states))
            if pipeline == KEPT:
                truth.commit(batch(txid), total_delta(txid), attempt)
    stage(txlog, KEPT, counts[KEPT], totals[KEPT], LAST + 1, [("eu", 1, 1)], 1)  # in flight
    while txlog.prune(PRUNED):
        pass
    floor = {}
    for pipeline in (KEPT, PRUNED):
        info = txlog.retention(pipeline)
        floor[pipeline] = as_of_floor(info.pruned_through_txid, info.undo_from_txid)
    assert floor[KEPT] == 0 and 1 < floor[PRUNED] < LAST  # the pruned one refuses some
    assert truth.attempts[FAILED_FIRST] == 2
    yield Built(txlog, counts, totals, truth, floor)
    engine.dispose()


class ReadsSome:
    """A user who may read only the DAGs named."""

    def __init__(self, *dag_ids):
        self.dag_ids = set(dag_ids)

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        return False

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        return set(self.dag_ids)


DAGS = {KEPT: frozenset({KEPT}), PRUNED: frozenset({PRUNED})}


@pytest.fixture
def client(built):
    return plugin_client(built.txlog, ReadsAll(), pipeline_dags=DAGS)


def api(pipeline: str, state: str = "") -> str:
    base = f"/transactions/api/pipelines/{pipeline}"
    return f"{base}/states/{pipeline}_{state}" if state else base


def kept_txids(built: Built, pipeline: str) -> range:
    """The txids whose undo records are kept: a history lists them, their changes are read."""
    return range(built.floor[pipeline] + 1, LAST + 1)


def expected_history(built: Built, pipeline: str, state: str, key: tuple) -> list[tuple]:
    t = built.truth
    return [
        (n, t.attempts[n], t.after[n - 1][state].get(key), t.after[n][state][key])
        for n in reversed(kept_txids(built, pipeline))
        if key in t.touched[n][state]
    ]


# -- a key's history ---------------------------------------------------------------------------


@pytest.mark.parametrize("pipeline", [KEPT, PRUNED])
def test_a_keys_history_is_each_kept_txid_that_changed_it_newest_first(client, built, pipeline):
    t = built.truth
    keys = sorted({k for n in range(1, LAST + 1) for k in t.touched[n]["counts"]})
    assert len(keys) > BULK
    for key in keys:
        got = client.get(
            f"{api(pipeline, 'counts')}/history", params=[("key", key[0]), ("key", str(key[1]))]
        )
        assert got.status_code == 200, got.text
        data = got.json()
        rows = [(r["txid"], r["attempt"], r["before"], r["after"]) for r in data["history"]]
        assert rows == expected_history(built, pipeline, "counts", key), key
        assert all(r["change"] == (r["after"] or 0) - (r["before"] or 0) for r in data["history"])
        assert all(
            r["committed_at"] and r["run_id"] == f"txid-{r['txid']:06d}" for r in data["history"]
        )
        assert (data["key"], data["key_label"]) == (list(key), f"{key[0]}, {key[1]}")
        assert data["current"] == t.after[LAST]["counts"][key]
        assert (data["floor"], data["last_committed"]) == (built.floor[pipeline], LAST)
        assert data["reach"] == f"txids {built.floor[pipeline] + 1} … {LAST} are kept"
        assert data["more"] is False


def test_a_history_is_bounded_and_says_there_is_more(client, built):
    t = built.truth
    key = max(
        t.after[LAST]["counts"],
        key=lambda k: sum(k in t.touched[n]["counts"] for n in range(1, LAST + 1)),
    )
    full = expected_history(built, KEPT, "counts", key)
    assert len(full) >= 3
    params = [("key", key[0]), ("key", str(key[1])), ("limit", "2")]
    data = client.get(f"{api(KEPT, 'counts')}/history", params=params).json()
    assert [(r["txid"], r["attempt"], r["before"], r["after"]) for r in data["history"]] == full[:2]
    assert (data["limit"], data["more"]) == (2, True)
    absent = client.get(f"{api(KEPT, 'counts')}/history", params=[("key", "nowhere"), ("key", "1")])
    assert absent.json()["history"] == [] and absent.json()["current"] is None


def test_a_global_states_history_needs_no_key(client, built):
    for pipeline in (KEPT, PRUNED):
        data = client.get(f"{api(pipeline, 'total')}/history").json()
        rows = [(r["txid"], r["attempt"], r["before"], r["after"]) for r in data["history"]]
        assert rows == expected_history(built, pipeline, "total", (True,))
        assert (data["type"], data["key"], data["key_label"]) == ("global", [], "(value)")
        assert data["current"] == built.truth.after[LAST]["total"][(True,)]
    # txid 5's second attempt committed it: the history says so
    rows = client.get(f"{api(KEPT, 'total')}/history").json()["history"]
    assert {r["txid"]: r["attempt"] for r in rows}[FAILED_FIRST] == 2


@pytest.mark.parametrize(
    ("state", "params", "status", "says"),
    [
        ("counts", [("key", "eu")], 422, "keyed by area, slot: give one value per column"),
        ("counts", [("key", "eu"), ("key", "one")], 422, "'slot' is of type integer: 'one'"),
        ("counts", [("key", "eu"), ("key", "99999999999")], 422, "is of type integer"),
        ("total", [("key", "eu")], 422, "is global: it has one value and no key"),
        ("nothing", [], 404, f"pipeline {KEPT!r} has no state '{KEPT}_nothing'"),
        ("counts", [("key", "eu"), ("key", "1"), ("limit", "0")], 422, "invalid request"),
    ],
)
def test_a_history_refuses_what_is_no_key_of_the_state(client, state, params, status, says):
    got = client.get(f"{api(KEPT, state)}/history", params=params)
    assert got.status_code == status, got.text
    assert says in got.json()["detail"]


# -- a state as of a txid ----------------------------------------------------------------------


def test_a_state_as_of_every_kept_txid_is_the_fold_of_its_batches(client, built):
    t = built.truth
    for pipeline in (KEPT, PRUNED):
        for n in range(built.floor[pipeline], LAST + 1):
            truth = t.after[n]["counts"]
            got = client.get(f"{api(pipeline, 'counts')}/as_of", params={"txid": n, "limit": 5})
            assert got.status_code == 200, got.text
            data = got.json()
            assert (data["txid"], data["type"], data["keys"]) == (n, "map", len(truth))
            assert data["sum"] == sum(truth.values())
            top = [(tuple(r["key_values"]), r["value"]) for r in data["top"]]
            assert [v for _, v in top] == sorted(truth.values(), reverse=True)[:5], n
            assert all(truth[k] == v for k, v in top) and len(set(top)) == len(top)
            assert all(
                r["key"] == f"{r['key_values'][0]}, {r['key_values'][1]}" for r in data["top"]
            )
            assert (data["floor"], data["last_committed"]) == (built.floor[pipeline], LAST)
            total = client.get(f"{api(pipeline, 'total')}/as_of", params={"txid": n}).json()
            assert (total["type"], total["value"]) == ("global", t.after[n]["total"].get((True,)))
    whole = client.get(f"{api(KEPT, 'counts')}/as_of", params={"txid": 3}).json()
    assert len(whole["top"]) == state_reads.AS_OF_LIMIT < whole["keys"]
    assert client.get(f"{api(KEPT, 'counts')}/as_of", params={"txid": 0}).json()["keys"] == 0


@pytest.mark.parametrize("state", ["counts", "total"])
def test_a_state_as_of_a_txid_beyond_retention_or_not_committed_is_refused(client, built, state):
    floor = built.floor[PRUNED]
    for n, why in (
        (0, "retention keeps undo records"),
        (floor - 1, "retention keeps undo records"),
        (LAST + 1, f"the last committed txid is {LAST}"),
    ):
        got = client.get(f"{api(PRUNED, state)}/as_of", params={"txid": n})
        assert got.status_code == 409, (n, got.text)
        body = got.json()
        assert body["error"] == "StateTxidNotReadableError"
        assert (body["pipeline"], body["txid"], body["state"]) == (PRUNED, n, f"{PRUNED}_{state}")
        assert (body["floor"], body["last_committed"]) == (floor, LAST)
        assert f"cannot read as of {n}: txids {floor} to {LAST} can be read" in body["detail"]
        assert why in body["detail"]


def test_the_reads_of_a_states_past_are_for_readers_of_its_dag_only(built):
    reads = (
        (f"{api(KEPT, 'counts')}/history", [("key", "eu"), ("key", "1")]),
        (f"{api(KEPT, 'counts')}/as_of", [("txid", "3")]),
        (f"{api(KEPT, 'total')}/history", []),
    )
    # one client at a time: each stands in for the app's dependencies anew
    for manager, status in ((None, 401), (ReadsSome("another_dag"), 403), (ReadsSome(KEPT), 200)):
        user = plugin_client(built.txlog, manager, pipeline_dags=DAGS)
        for path, params in reads:
            got = user.get(path, params=params)
            assert got.status_code == status, (manager, path, got.text)
            if status != 200:
                assert "bulk" not in got.text and "history" not in got.json()
    assert user.get(f"{api(PRUNED, 'total')}/history").status_code == 403


# -- what a txid changed -----------------------------------------------------------------------


def test_a_txids_payload_has_what_it_changed_in_each_state_largest_first(client, built):
    t = built.truth
    limit = state_reads.CHANGES_LIMIT
    for pipeline in (KEPT, PRUNED):
        for n in kept_txids(built, pipeline):
            x = client.get(f"{api(pipeline)}/txids/{n}").json()["changes"]
            assert (x["status"], x["limit"]) == ("ok", limit)
            states = {s["name"]: s for s in x["states"]}
            assert list(states) == [f"{pipeline}_counts", f"{pipeline}_total"]
            for state in ("counts", "total"):
                got = states[f"{pipeline}_{state}"]
                before, after = t.after[n - 1][state], t.after[n][state]
                truth = {k: (before.get(k), after[k]) for k in t.touched[n][state]}
                rows = got["changes"]
                keys = [tuple(r["key_values"]) if r["key_values"] else (True,) for r in rows]
                assert all(
                    truth[k] == (r["before"], r["after"]) for k, r in zip(keys, rows, strict=True)
                )
                sizes = [abs(r["change"]) for r in rows]
                expected = sorted((abs(a - (b or 0)) for b, a in truth.values()), reverse=True)
                assert sizes == expected[:limit], (pipeline, n, state)
                assert len(set(keys)) == len(rows) == min(len(truth), limit)
                assert got["more"] is (len(truth) > limit)
            if n == 3:  # the bulk txid: the 20 largest of its 25 new keys
                bulk = states[f"{pipeline}_counts"]
                assert bulk["more"] and [r["after"] for r in bulk["changes"]] == list(
                    range(BULK, BULK - limit, -1)
                )
                assert all(r["before"] is None for r in bulk["changes"])


def test_a_txid_beyond_retention_says_so_and_one_in_flight_changed_nothing(client, built):
    floor = built.floor[PRUNED]
    for n in range(1, floor + 1):  # its changes need the state as of n - 1 too
        x = client.get(f"{api(PRUNED)}/txids/{n}").json()["changes"]
        assert (x["status"], x["states"]) == ("refused", [])
        assert (
            f"cannot read what txid {n} changed: txids {floor + 1} to {LAST} can be read"
            in x["message"]
        )
        page = client.get(f"/transactions/pipelines/{PRUNED}/runs/txid-{n:06d}")
        assert page.status_code == 200  # the page, with a sentence: no error page
        assert f"cannot read what txid {n} changed" in page.text
    waiting = client.get(f"{api(KEPT)}/txids/{LAST + 1}").json()["changes"]
    assert waiting["status"] == "not_committed"
    assert waiting["message"] == (
        f"txid {LAST + 1} has not committed (the last committed txid is {LAST}): it changed no "
        "state yet"
    )


def test_the_txid_page_renders_what_it_changed_escaped(client, built):
    t = built.truth
    n = next(
        n for n in range(1, LAST + 1) if any(r == "<i>ap</i>" for r, _ in t.touched[n]["counts"])
    )
    html = client.get(f"/transactions/pipelines/{KEPT}/runs/txid-{n:06d}").text
    assert "<h2>What it changed" in html
    assert f'<table class="grid small changes" data-state="{KEPT}_counts">' in html
    assert "&lt;i&gt;ap&lt;/i&gt;" in html and "<i>ap</i>" not in html
    bulk = client.get(f"/transactions/pipelines/{KEPT}/runs/txid-000003").text
    assert bulk.count("<tr><td>bulk, ") == state_reads.CHANGES_LIMIT
    assert f"the {state_reads.CHANGES_LIMIT} largest changes: it changed more keys" in bulk


def test_the_pipeline_page_draws_the_forms_on_each_state_card(client):
    html = client.get(f"/transactions/pipelines/{KEPT}").text
    url = f"/transactions/api/pipelines/{KEPT}/states/{KEPT}_counts"
    assert f'<div class="state-reads" data-state="{KEPT}_counts" data-url="{url}">' in html
    assert 'placeholder="area"' in html and 'placeholder="slot"' in html
    assert html.count('data-read="as_of"') == 2 and html.count('data-read="history"') == 2


# -- a real browser ----------------------------------------------------------------------------


def cells(locator) -> list[list[str]]:
    return locator.evaluate_all(
        "rows => rows.map(r => Array.from(r.querySelectorAll('td'), c => c.innerText.trim()))"
    )


def shown(value: Any) -> str:
    return "—" if value is None else str(value)


def next_refresh(page) -> None:
    """Wait for the page's script to refresh once more (its stamp says a newer second)."""
    stamp = page.locator("#stamp").inner_text()
    page.wait_for_function(
        f"() => document.getElementById('stamp').textContent !== {stamp!r}", timeout=20_000
    )


def test_a_browser_shows_a_keys_history_and_a_state_as_of_a_txid(served, built):
    t = built.truth
    key = max(
        t.after[LAST]["counts"],
        key=lambda k: sum(k in t.touched[n]["counts"] for n in range(1, LAST + 1)),
    )
    errors: list[str] = []
    with chromium_page() as page:
        page.on("pageerror", lambda err: errors.append(str(err)))
        with screenshot_on_failure(page, "state-reads-failure"):
            page.goto(f"{served}/pipelines/{KEPT}")
            next_refresh(page)
            card = page.locator(f'#states .state[data-state="{KEPT}_counts"]')
            inputs = card.locator("input[name=key]")
            inputs.nth(0).fill(key[0])
            inputs.nth(1).fill(str(key[1]))
            card.get_by_role("button", name="key history").click()
            rows = card.locator(".reads-result table.history tbody tr")
            rows.first.wait_for()
            expected = expected_history(built, KEPT, "counts", key)
            got = cells(rows)
            assert [[r[0], r[1], r[3], r[4]] for r in got] == [
                [str(n), str(a), shown(b), shown(v)] for n, a, b, v in expected
            ]
            changes = [state_reads.signed(v - (b or 0)) for _, _, b, v in expected]
            assert [r[5] for r in got] == changes
            head = card.locator(".reads-result .reads-head").inner_text()
            assert f"{key[0]}, {key[1]}" in head and f"now {t.after[LAST]['counts'][key]}" in head
            next_refresh(page)  # the answer stays while the card's figures refresh
            assert len(cells(rows)) == len(expected)
            assert inputs.nth(0).input_value() == key[0]

            card.locator("input[name=txid]").fill("3")
            card.get_by_role("button", name="as of txid").click()
            top = card.locator(".reads-result table.as-of tbody tr")
            top.first.wait_for()
            truth = t.after[3]["counts"]
            got = cells(top)
            assert [int(v) for _, v in got] == sorted(truth.values(), reverse=True)[: len(got)]
            assert len(got) == state_reads.AS_OF_LIMIT
            by_label = {f"{r}, {n}": v for (r, n), v in truth.items()}
            assert all(by_label[k] == int(v) for k, v in got)
            head = card.locator(".reads-result .reads-head").inner_text()
            assert head == f"as of txid 3: {len(truth)} keys · sum {sum(truth.values())}"
            screenshot(page, "transactions-state-reads", full_page=True)

            total = page.locator(f'#states .state[data-state="{KEPT}_total"]')
            total.get_by_role("button", name="history").click()
            whole = total.locator(".reads-result table.history tbody tr")
            whole.first.wait_for()
            assert [r[0] for r in cells(whole)] == [str(n) for n in range(LAST, 0, -1)]

            # the pruned pipeline refuses a txid beyond retention, with the typed error's words
            page.goto(f"{served}/pipelines/{PRUNED}")
            card = page.locator(f'#states .state[data-state="{PRUNED}_counts"]')
            card.locator("input[name=txid]").fill("1")
            card.get_by_role("button", name="as of txid").click()
            refusal = card.locator(".reads-result .refusal")
            refusal.wait_for()
            floor = built.floor[PRUNED]
            assert (
                f"cannot read as of 1: txids {floor} to {LAST} can be read" in refusal.inner_text()
            )

            # a txid's page: what it changed, the largest first
            page.goto(f"{served}/pipelines/{KEPT}/runs/txid-000003")
            page.evaluate("document.getElementById('changes').replaceChildren()")
            page.wait_for_function(
                "() => document.getElementById('changes').childElementCount > 0", timeout=20_000
            )
            changed = cells(page.locator(f'#changes table[data-state="{KEPT}_counts"] tbody tr'))
            assert [r[2] for r in changed] == [str(v) for v in range(BULK, BULK - 20, -1)]
            assert all(r[1] == "—" and r[3] == f"+{r[2]}" for r in changed)
            assert "it changed more keys" in page.locator("#changes").inner_text()
            page.goto(f"{served}/pipelines/{PRUNED}/runs/txid-000001")
            next_refresh(page)
            assert (
                "cannot read what txid 1 changed" in page.locator("#changes .notice").inner_text()
            )
            assert page.locator("#banner").is_hidden()
    assert errors == []
