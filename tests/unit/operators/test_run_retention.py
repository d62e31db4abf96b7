"""Retention of Airflow's DAG runs through the REST API, against a fake api-server on loopback that
keeps runs in memory: old finished txid runs are deleted (oldest first, bounded), nothing newer,
running or manual is, and a failing api-server never fails the commit that asked.

A real Airflow test would go beside ``tests/integration/on_airflow/test_airflow_e2e.py``: a
pipeline with a small ``keep_txids`` (e.g. 20) run past ~40 txids, then ``GET
/api/v2/dags/{dag}/dagRuns`` lists only the newest ones and the scheduler keeps creating new runs
in order.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.operators import run_retention
from airflow_txn_provider.rules.config import PRUNE_EVERY
from airflow_txn_provider.timetables import txid_logical_date, txid_run_id


class FakeAirflow(ThreadingHTTPServer):
    def __init__(self, runs: dict[str, tuple[str, str, str]], fail: int | None = None) -> None:
        self.runs = runs  # run_id -> (state, run_type, logical_date iso)
        self.fail = fail
        self.requests: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", 0), Api)


class Api(BaseHTTPRequestHandler):
    server: FakeAirflow

    def _reply(self, status: int, body: object = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.server.requests.append(("GET", url.path))
        if self.server.fail:
            return self._reply(self.server.fail, {"detail": "down"})
        q = parse_qs(url.query)
        lte = q["logical_date_lte"][0]
        found = sorted(
            (date, run_id)
            for run_id, (state, run_type, date) in self.server.runs.items()
            if state in q["state"]
            and run_type in q.get("run_type", [run_type])
            and date <= lte
            and run_id.startswith(q["run_id_prefix_pattern"][0])
        )
        assert q["order_by"] == ["logical_date"]
        limit = int(q["limit"][0])
        self._reply(200, {"dag_runs": [{"dag_run_id": r} for _, r in found[:limit]]})

    def do_DELETE(self) -> None:
        self.server.requests.append(("DELETE", self.path))
        run_id = self.path.rsplit("/", 1)[1]
        if run_id not in self.server.runs:
            return self._reply(404, {"detail": "not found"})
        if self.server.runs[run_id][0] == "running":
            return self._reply(409, {"detail": "running"})
        del self.server.runs[run_id]
        self._reply(204)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def airflow():
    servers = []

    def start(runs, fail=None):
        server = FakeAirflow(runs, fail)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        hook = AirflowApiHook(timeout=1.0, outage_timeout=0.5)
        hook.base_url = lambda: f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[method-assign]
        hook._token = "token"
        return server, hook

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def txid_runs(n: int, state: str = "success") -> dict[str, tuple[str, str, str]]:
    return {
        # the waker's runs (manual), a claim's (operator_triggered); runs the timetable scheduled
        # before 0.4 are pruned alike
        txid_run_id(t): (
            state,
            ("scheduled", "manual", "operator_triggered")[t % 3],
            txid_logical_date(t).isoformat(),
        )
        for t in range(1, n + 1)
    }


def test_deletes_old_finished_txid_runs_oldest_first_bounded(airflow):
    runs = txid_runs(30)
    runs["manual__2024"] = ("success", "manual", txid_logical_date(1).isoformat())
    server, hook = airflow(runs)
    assert hook.prune_txid_runs("words", 12, limit=5) == [txid_run_id(t) for t in range(1, 6)]
    assert hook.prune_txid_runs("words", 12, limit=50) == [txid_run_id(t) for t in range(6, 13)]
    assert hook.prune_txid_runs("words", 12) == []  # idempotent
    assert sorted(server.runs) == sorted([*(txid_run_id(t) for t in range(13, 31)), "manual__2024"])
    assert hook.delete_dag_run("words", txid_run_id(1)) is False  # gone already: no error


def test_a_running_old_run_is_left_alone(airflow):
    runs = txid_runs(10)
    runs[txid_run_id(3)] = ("running", "scheduled", txid_logical_date(3).isoformat())
    server, hook = airflow(runs)
    assert txid_run_id(3) not in hook.prune_txid_runs("words", 5)
    assert txid_run_id(3) in server.runs


class Pipeline:
    name = "words"
    keep_txids = 10
    airflow_api_conn_id = "airflow_api_default"


def test_the_commit_path_prunes_every_few_txids_and_never_raises(airflow, monkeypatch, caplog):
    server, hook = airflow(txid_runs(40))
    monkeypatch.setattr(
        "airflow_txn_provider.operators.run_retention.AirflowApiHook", lambda *a, **k: hook
    )
    logger = logging.getLogger("test")
    assert run_retention.prune_airflow_runs(Pipeline(), "words", [PRUNE_EVERY + 1], logger) == []
    assert server.requests == []  # not a pruning txid: no request at all
    deleted = run_retention.prune_airflow_runs(
        Pipeline(), "words", [2 * PRUNE_EVERY - 1, 2 * PRUNE_EVERY], logger
    )
    assert deleted == [txid_run_id(t) for t in range(1, 2 * PRUNE_EVERY - 10 + 1)]

    server.fail = 500  # the api-server is failing: a warning, the commit goes on
    with caplog.at_level(logging.WARNING):
        assert (
            run_retention.prune_airflow_runs(Pipeline(), "words", [3 * PRUNE_EVERY], logger) == []
        )
    assert "could not delete DAG runs" in caplog.text
