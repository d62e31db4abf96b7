"""Every button of the Airflow UI on a running txid pipeline, pressed as a person would (the same
``/api/v2`` calls the buttons make) on a real Airflow: scheduler (LocalExecutor), dag-processor,
triggerer and api-server, a Spark Connect server and the transaction log, all on 127.0.0.1.

One pipeline per click, several side by side on one deployment (tests/dags/txn_clicks.py): six
txids of data, three in flight, a job of ~12 s so the click lands while txid 2 processes, a 15 s
lease. After each click the pipeline must commit every txid *by itself* (nobody clears anything
after the click), in order, with states equal to word counts computed in plain Python (nothing
applied twice, nothing lost), and the UI must say what happened: a note on each run the pipeline
restarted, recreated or freed. The time from the click to txid 2's commit is printed.

``make test`` runs the clicks that used to stop a pipeline in silence (Mark success, and Mark
failed then Delete, on a processing txid's run; a manual trigger on the next txid's logical date)
and Mark failed on a committed txid's run (its note); ``make test-scenarios`` runs every other
button too (Mark failed on the run among them, and the stall the health endpoint reports while the
DAG is paused).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_txn_provider.rules.config import RUNS_AHEAD
from airflow_txn_provider.state import MapState
from airflow_txn_provider.timetables import txid_from_run_id, txid_logical_date, txid_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import new_database, wait_until
from tests.spark_data import parquet_dataset, random_lines, word_counts
from txn_testing.airflow import AirflowClient, AirflowStack, txn_log_connection_env

DAGS = Path(__file__).resolve().parents[2] / "dags"
TXIDS = 6


def _txids(click: str) -> int:
    """The txids of a click's pipeline: ``TXIDS``, and for a manual run on the next free slot
    enough more that the slot is a txid with data (by the click the runs of the window of 3 and
    of the ``RUNS_AHEAD`` past it exist)."""
    return TXIDS + RUNS_AHEAD + 1 if click == "trigger_next_slot" else TXIDS


BATCH = 20  # tests/dags/txn_clicks.py
LEASE = 15.0
JOB_SECONDS = 12  # a click lands about 4 s into the job
SEED = 5611  # the data of pipeline i is random_lines(SEED + i, ...)
PROCESS, COMMIT, WATCH = "process_slow_word_count", "commit", "watch_failures"
R2 = txid_run_id(2)
HEAL_WITHIN = LEASE + 60 + 120  # the bound, plus room for a loaded 2-core machine


@dataclass
class Ctx:
    """One pipeline under test: its DAG (named as the pipeline), the API, the log."""

    dag: str
    api: AirflowClient
    log: TransactionLog
    airflow: AirflowStack
    said: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A raw call: the test asserts on refusals too."""
        return self.api.http.request(method, path, **kwargs)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.call(method, path, **kwargs)
        assert response.status_code < 400, (method, path, response.status_code, response.text)
        return response.json() if response.content else None

    def run(self, run_id: str) -> dict[str, Any] | None:
        response = self.call("GET", f"/dags/{self.dag}/dagRuns/{run_id}")
        return None if response.status_code == 404 else response.json()

    def mark_run(self, run_id: str, state: str) -> None:
        self.ok("PATCH", f"/dags/{self.dag}/dagRuns/{run_id}", json={"state": state})

    def mark_task(self, run_id: str, task: str, state: str) -> None:
        path = f"/dags/{self.dag}/dagRuns/{run_id}/taskInstances/{task}"
        self.ok("PATCH", path, json={"new_state": state})

    def trigger(self, **body: Any) -> dict[str, Any]:
        return dict(
            self.ok("POST", f"/dags/{self.dag}/dagRuns", json={"logical_date": None, **body})
        )

    def health(self) -> dict[str, Any]:
        response = httpx.get(
            f"{self.airflow.url}/transactions/api/pipelines/{self.dag}/health",
            headers=self.api.http.headers,
            timeout=30,
        )
        return {"code": response.status_code, **response.json()}


# -- the clicks ----------------------------------------------------------------------------------
RECREATED = "created it again"
"""The note of a deleted run the pipeline created again. If the job the click interrupted still
recorded its output before Airflow killed it, a later txid's task commits that attempt and no
task of the run is needed: the run stays deleted (checked against the committed attempt)."""

# Each presses its button(s) while txid 2 processes and returns the notes the UI must show
# afterwards: {run_id: words the run's note holds}.


def run_success(c: Ctx) -> dict[str, str]:
    c.mark_run(R2, "success")
    return {R2: "marked success"}


def run_failed(c: Ctx) -> dict[str, str]:
    c.mark_run(R2, "failed")
    return {R2: "marked failed"}


def run_failed_then_delete(c: Ctx) -> dict[str, str]:
    c.mark_run(R2, "failed")
    wait_until(lambda: (c.run(R2) or {}).get("state") == "failed", 60, "the run to fail", c.airflow)
    response = c.call("DELETE", f"/dags/{c.dag}/dagRuns/{R2}")
    assert response.status_code == 204, response.text
    return {R2: RECREATED}


def trigger_next_slot(c: Ctx) -> dict[str, str]:
    """Trigger DAG with the logical date of the next txid that has no run yet."""
    for _ in range(10):  # a claim may create that run meanwhile (409): the next slot, then
        runs = c.ok("GET", f"/dags/{c.dag}/dagRuns", params={"limit": 100})["dag_runs"]
        txids = [txid_from_run_id(r["dag_run_id"]) for r in runs]
        slot = max(t for t in txids if t is not None) + 1
        body = {"logical_date": txid_logical_date(slot).isoformat()}
        response = c.call("POST", f"/dags/{c.dag}/dagRuns", json=body)
        if response.status_code != 409:
            break
    assert response.status_code == 200, response.text
    manual = response.json()
    c.said["manual"] = manual["dag_run_id"]
    return {txid_run_id(slot): manual["dag_run_id"]}


def task_success(task: str) -> Callable[[Ctx], dict[str, str]]:
    def click(c: Ctx) -> dict[str, str]:
        c.mark_task(R2, task, "success")
        return {}

    click.__name__ = f"task_{task}_success"
    return click


def task_failed(task: str) -> Callable[[Ctx], dict[str, str]]:
    def click(c: Ctx) -> dict[str, str]:
        c.mark_task(R2, task, "failed")
        return {}

    click.__name__ = f"task_{task}_failed"
    return click


def watch_failed_then_fails(c: Ctx) -> dict[str, str]:
    """Its failure sensor marked failed; then the job fails (injected, 10 s in): nobody is left
    in the run to answer the failure."""
    c.mark_task(R2, WATCH, "failed")
    return {R2: "failed and waits for its failure sensor"}


def clear_run_mid_job(c: Ctx) -> dict[str, str]:
    c.ok("POST", f"/dags/{c.dag}/dagRuns/{R2}/clear", json={"dry_run": False})
    return {}


def clear_future_from_committed(c: Ctx) -> dict[str, str]:
    wait_until(lambda: c.log.last_committed(c.dag) >= 1, 120, "txid 1 to commit", c.airflow)
    body = {
        "dry_run": False,
        "dag_run_id": txid_run_id(1),
        "task_ids": [PROCESS],
        "include_future": True,
        "include_downstream": True,
        "only_failed": False,
    }
    c.ok("POST", f"/dags/{c.dag}/clearTaskInstances", json=body)
    return {}


def trigger_without_conf(c: Ctx) -> dict[str, str]:
    manual = c.trigger()
    c.said["manual"] = manual["dag_run_id"]
    return {}


def trigger_with_conf_txid(c: Ctx) -> dict[str, str]:
    manual = c.trigger(conf={"txid": 2})
    c.said["manual"] = manual["dag_run_id"]
    return {}


def delete_running_run(c: Ctx) -> dict[str, str]:
    response = c.call("DELETE", f"/dags/{c.dag}/dagRuns/{R2}")
    c.said["delete"] = response.status_code
    return {}


def pause_then_unpause(c: Ctx) -> dict[str, str]:
    c.api.pause(c.dag)
    time.sleep(LEASE + 10)  # long enough for txid 2's job to end and its lease to run out
    c.api.unpause(c.dag)
    return {}


def backfill(c: Ctx) -> dict[str, str]:
    body = {
        "dag_id": c.dag,
        "from_date": txid_logical_date(1).isoformat(),
        "to_date": txid_logical_date(3).isoformat(),
        "max_active_runs": 1,
    }
    c.said["backfill"] = c.call("POST", "/backfills", json=body).status_code
    return {}


def run_success_while_paused(c: Ctx) -> dict[str, str]:
    """Mark success on the run, then pause the DAG: its waker stops too, so nothing mends the
    txid; the health endpoint must say so within a minute of the lease, then unpausing heals."""
    c.mark_run(R2, "success")
    c.api.pause(c.dag)

    def stalled() -> dict[str, Any] | None:
        found = c.health()
        return found if found["code"] == 503 else None

    found = wait_until(
        stalled, LEASE + 60 + 30, "the health endpoint to report the stall", c.airflow
    )
    c.said["health"] = found
    c.api.unpause(c.dag)
    return {R2: "marked success"}


def committed_run_failed(c: Ctx) -> dict[str, str]:
    """Mark failed on the run of a txid that committed: red in the grid, nothing to do."""
    r1 = txid_run_id(1)
    wait_until(lambda: (c.run(r1) or {}).get("state") == "success", 120, "txid 1's run", c.airflow)
    c.mark_run(r1, "failed")
    return {r1: "txid 1 had committed already: nothing changes in the log"}


@dataclass(frozen=True)
class Click:
    act: Callable[[Ctx], dict[str, str]]
    inject: str | None = None
    """The failure-injection Variable's value, set before the pipeline starts."""

    @property
    def name(self) -> str:
        return self.act.__name__


CLICKS = {
    c.name: c
    for c in (
        Click(run_success),
        Click(run_failed),
        Click(run_failed_then_delete),
        Click(trigger_next_slot),
        Click(task_success(PROCESS)),
        Click(task_failed(PROCESS)),
        Click(task_success(COMMIT)),
        Click(task_failed(COMMIT)),
        Click(task_success(WATCH)),
        Click(watch_failed_then_fails, inject="2:1@10"),
        Click(clear_run_mid_job),
        Click(clear_future_from_committed),
        Click(trigger_without_conf),
        Click(trigger_with_conf_txid),
        Click(delete_running_run),
        Click(pause_then_unpause),
        Click(backfill),
        Click(run_success_while_paused),
        Click(committed_run_failed),
    )
}
IN_CI = ("run_success", "run_failed_then_delete", "trigger_next_slot", "committed_run_failed")
"""The clicks that stopped a pipeline in silence before the waker kept runs alive, and the note
on a committed txid's run (the listener's)."""
GROUPS = [
    pytest.param(IN_CI, id="stopped-before"),
    pytest.param(
        (
            "run_failed",
            "task_process_slow_word_count_success",
            "task_process_slow_word_count_failed",
            "task_commit_success",
            "task_commit_failed",
        ),
        id="marks",
        marks=pytest.mark.scenario,
    ),
    pytest.param(
        (
            "task_watch_failures_success",
            "watch_failed_then_fails",
            "clear_run_mid_job",
            "clear_future_from_committed",
            "trigger_with_conf_txid",
        ),
        id="watch-clear-conf",
        marks=pytest.mark.scenario,
    ),
    pytest.param(
        (
            "trigger_without_conf",
            "delete_running_run",
            "pause_then_unpause",
            "backfill",
            "run_success_while_paused",
        ),
        id="refusals-pause",
        marks=pytest.mark.scenario,
    ),
]


def test_every_group_names_known_clicks_and_every_click_is_in_one_group():
    named = [n for g in GROUPS for n in g.values[0]]
    assert sorted(named) == sorted(CLICKS), "a click without a group, or a group naming none"
    assert len({_pipeline(n) for n in named}) == len(named)  # each its own valid pipeline


@pytest.mark.parametrize("names", GROUPS)
def test_a_click_never_stops_the_pipeline(names, postgres, db_url, connect_server, tmp_path):
    pipelines = [_pipeline(n) for n in names]
    print(f"seed {SEED}; clicks {list(names)}")
    data = {
        p: random_lines(SEED + i, _txids(n) * BATCH)
        for i, (n, p) in enumerate(zip(names, pipelines, strict=True))
    }
    for p, lines in data.items():
        parquet_dataset(tmp_path / "data" / p, {"0": lines})
    env = {
        "TXN_CLICKS": ",".join(pipelines),
        "TXN_CLICKS_DATA": str(tmp_path / "data"),
        "TXN_CLICKS_JOB_SECONDS": str(JOB_SECONDS),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_server.url,
        **txn_log_connection_env("txn_log_default", db_url),
    }
    meta = new_database(postgres, migrated=False)
    airflow = AirflowStack(tmp_path / "airflow", meta, DAGS, env=env, parallelism=24)
    txlog = TransactionLog.from_url(db_url, migrate=True)
    try:
        airflow.start()
        api = airflow.client()
        for p in pipelines:
            api.wait_for_dag(p)
        ctxs = {
            n: Ctx(p, airflow.client(), txlog, airflow)
            for n, p in zip(names, pipelines, strict=True)
        }
        for n, c in ctxs.items():
            if CLICKS[n].inject:
                api.set_variable(f"txn_inject_failure__{c.dag}", CLICKS[n].inject)
        for p in pipelines:
            api.unpause(p)
        with ThreadPoolExecutor(len(ctxs)) as pool:
            futures = {
                n: pool.submit(_press_and_check, CLICKS[n], c, data[c.dag]) for n, c in ctxs.items()
            }
            failed = {n: f.exception() for n, f in futures.items() if f.exception() is not None}
        assert not failed, "\n\n".join(f"{n}: {type(e).__name__}: {e}" for n, e in failed.items())
    finally:
        airflow.stop()
        txlog.engine.dispose()


def _pipeline(click: str) -> str:
    """The pipeline (and DAG) of a click: its state's name must stay within 40 characters."""
    name = "c_" + click.replace("slow_word_count_", "")
    assert len(f"{name}_counts") <= 40, name
    return name


def _press_and_heal(click: Click, c: Ctx) -> tuple[float, dict[str, str]]:
    """Wait until txid 2 is a few seconds into its job, press, then wait for every txid."""

    def txid_2_busy() -> bool:
        rec = c.log.view(c.dag).record(2)
        return bool(
            rec is not None
            and rec.status.value == "processing"
            and rec.attempt == 1
            and rec.begun_at is not None
            and c.log.view(c.dag).now is not None
            and (c.log.view(c.dag).now - rec.begun_at).total_seconds() >= 4
        )

    from airflow_txn_provider.rules.exceptions import UnknownPipelineError

    wait_until(
        txid_2_busy, 300, f"{c.dag}: txid 2 to be mid-job", c.airflow, (UnknownPipelineError,)
    )
    pressed = time.monotonic()
    try:
        notes = click.act(c)
    except httpx.TimeoutException as err:  # say what the api-server was doing, not only that
        raise AssertionError(
            f"{c.dag}: the click's request to the api-server got no answer "
            f"({type(err).__name__} after {time.monotonic() - pressed:.0f} s):\n"
            + c.airflow.tail("api-server", lines=120)
            + "\n"
            + c.airflow.log_sessions()
        ) from err
    wait_until(lambda: c.log.last_committed(c.dag) >= 2, HEAL_WITHIN, f"{c.dag}: txid 2", c.airflow)
    heal = time.monotonic() - pressed
    txids = _txids(click.name)
    wait_until(lambda: c.log.last_committed(c.dag) >= txids, 300, f"{c.dag}: every txid", c.airflow)
    return heal, notes


def _press_and_check(click: Click, c: Ctx, lines: list[str]) -> None:
    heal, notes = _press_and_heal(click, c)
    print(f"{click.name}: txid 2 committed {heal:.0f} s after the click")
    _check(c, lines, notes, _txids(click.name))
    _check_what_was_said(click.name, c)


def _check(c: Ctx, lines: list[str], notes: dict[str, str], txids: int) -> None:
    infos = c.log.transactions(c.dag)[:txids]
    assert [i.txid for i in infos] == list(range(1, txids + 1)), c.dag
    assert all(i.status.value == "committed" for i in infos), c.dag
    committed_at = [i.committed_at for i in infos]
    assert committed_at == sorted(committed_at), f"{c.dag}: commits out of txid order"
    # each txid's batch is its own offset range: none skipped, none read twice
    assert [i.metadata for i in infos] == [
        {"0": [BATCH * (t - 1), BATCH * t]} for t in range(1, txids + 1)
    ], c.dag
    state = MapState(c.dag, f"{c.dag}_counts", keys={"word": "text"})
    with c.log.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
    assert got == dict(word_counts(lines)), f"{c.dag}: the state is not ground truth"
    for run_id, words in notes.items():
        txid = txid_from_run_id(run_id)
        if words == RECREATED and c.run(run_id) is None:
            assert txid is not None and infos[txid - 1].attempt == 1, (c.dag, infos[txid - 1])
            continue  # its interrupted attempt committed: nothing needed the run (RECREATED)
        note = wait_until(
            lambda r=run_id: (c.run(r) or {}).get("note"),
            60,
            f"{c.dag}: {run_id}'s note",
            c.airflow,
        )
        # the click's own note ("Marked success by hand …") or the pipeline's ("… was marked
        # success …") when it restarted the run
        assert words.lower() in note.lower(), (c.dag, run_id, note)


def _check_what_was_said(name: str, c: Ctx) -> None:
    """The refusals Airflow answers, and what the health endpoint said."""
    if name == "delete_running_run":
        assert c.said["delete"] == 409, c.said  # Airflow refuses to delete a running run
    if name == "backfill":
        assert c.said["backfill"] == 422, c.said  # no backfill of a txid DAG (no schedule)
    if name == "trigger_next_slot":
        assert c.run(c.said["manual"]) is None, "the manual run on the slot was not deleted"
    if name in ("trigger_without_conf",):
        run = c.run(c.said["manual"])
        assert run is not None and run["state"] == "failed", run
    if name == "run_success_while_paused":
        health = c.said["health"]
        assert health["status"] == "stalled" and "past its lease" in health["reason"], health
