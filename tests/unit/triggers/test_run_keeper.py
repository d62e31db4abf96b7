"""The run keeper on a fake REST API: what it looks at, what it restarts, and the notes it leaves
(the real api-server is the integration tier's: tests/integration/on_airflow/test_ui_buttons.py)."""

from __future__ import annotations

from typing import Any

from airflow_txn_provider.rules.liveness import Need
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.timetables import txid_logical_date, txid_run_id
from airflow_txn_provider.triggers.run_keeper import ensure_txid_run, keep_alive

TASKS = ("process_words", "commit", "watch_failures")


class FakeApi:
    """Runs by id, each with a state, a logical date and its task states; records every call."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, str | None]] = {}
        self.calls: list[tuple[Any, ...]] = []

    def add(self, run_id: str, state: str, when: Any, **tasks: str | None) -> None:
        self.runs[run_id] = {"dag_run_id": run_id, "state": state, "logical_date": when}
        self.tasks[run_id] = {t: tasks.get(t, "deferred") for t in TASKS}

    def create_txid_run(self, dag_id: str, txid: int) -> bool:
        self.calls.append(("create", txid))
        when = txid_logical_date(txid)
        if any(r["logical_date"] == when for r in self.runs.values()):
            return False
        self.add(txid_run_id(txid), "queued", when)
        return True

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any] | None:
        return self.runs.get(run_id)

    def run_at(self, dag_id: str, when: Any) -> dict[str, Any] | None:
        return next((r for r in self.runs.values() if r["logical_date"] == when), None)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return [{"task_id": t, "state": s} for t, s in self.tasks[run_id].items()]

    def clear_task_instances(self, dag_id, task_ids, *, run_id, note, reset_dag_runs):
        self.calls.append(("clear", run_id, tuple(task_ids), reset_dag_runs))
        for t in task_ids:
            self.tasks[run_id][t] = None
        if reset_dag_runs:
            self.runs[run_id]["state"] = "queued"
        return list(task_ids)

    def set_run_note(self, dag_id: str, run_id: str, note: str) -> None:
        self.calls.append(("note", run_id))
        self.runs[run_id]["note"] = note

    def delete_dag_run(self, dag_id: str, run_id: str) -> bool:
        self.calls.append(("delete", run_id))
        return self.runs.pop(run_id, None) is not None


def _keep(api: FakeApi, rec: TxRecord, need: Need) -> str | None:
    return keep_alive(api, "d", rec, need, watch_task="watch_failures", commit_task="commit")


EXPIRED = TxRecord(2, 1, TxStatus.PROCESSING)
READY = TxRecord(3, 1, TxStatus.PROCESSED)


def test_a_run_whose_tasks_live_is_left_alone():
    api = FakeApi()
    api.add("txid-000002", "running", txid_logical_date(2), process_words="success")
    assert _keep(api, EXPIRED, Need.WATCH) is None
    assert api.calls == []


def test_a_run_marked_success_gets_its_watch_back_and_a_note_that_says_why():
    api = FakeApi()
    api.add("txid-000002", "success", txid_logical_date(2), **dict.fromkeys(TASKS, "success"))
    said = _keep(api, EXPIRED, Need.WATCH)
    assert api.calls[0] == ("clear", "txid-000002", ("watch_failures",), True)
    note = api.runs["txid-000002"]["note"]
    assert note == said
    assert "txid 2 attempt 1 was processing and its lease ran out" in note
    assert "marked success" in note and "re-queues" in note
    assert api.runs["txid-000002"]["state"] == "queued"


def test_a_ready_txid_whose_commit_was_marked_failed_gets_its_commit_back():
    api = FakeApi()
    api.add("txid-000003", "running", txid_logical_date(3), commit="failed")
    said = _keep(api, READY, Need.COMMIT)
    assert api.calls[0] == ("clear", "txid-000003", ("commit",), False)  # the run still runs
    assert said is not None and "commit was marked failed" in said and "it commits" in said


def test_a_deleted_run_is_created_again_with_a_note():
    api = FakeApi()
    said = _keep(api, TxRecord(2, 3, TxStatus.FAILED), Need.WATCH)
    assert ("create", 2) in api.calls and "txid-000002" in api.runs
    assert said is not None and "failed" in said and "created it again" in said


def test_a_due_txids_run_is_created_or_found_alive():
    api = FakeApi()
    assert ensure_txid_run(api, "d", 5) == (True, "new data: its DAG run is created")
    assert ensure_txid_run(api, "d", 5) == (True, "its run exists")


def test_a_due_txids_run_marked_before_its_claim_is_restarted_whole():
    api = FakeApi()
    api.add("txid-000005", "success", txid_logical_date(5), **dict.fromkeys(TASKS, "success"))
    settled, said = ensure_txid_run(api, "d", 5)
    assert settled and "before it began the txid" in said
    assert ("clear", "txid-000005", tuple(sorted(TASKS)), True) in api.calls


def test_a_slot_held_by_a_running_manual_run_is_reported_then_freed_once_it_ends():
    api = FakeApi()
    api.add("manual__2026", "running", txid_logical_date(4))
    settled, said = ensure_txid_run(api, "d", 4)
    assert not settled
    assert "manual__2026" in said and "holds its logical date" in said
    assert "txid-000004" not in api.runs and ("delete", "manual__2026") not in api.calls
    api.runs["manual__2026"]["state"] = "failed"  # its tasks fail at once: it is no transaction
    settled, said = ensure_txid_run(api, "d", 4)
    assert settled and ("delete", "manual__2026") in api.calls
    assert "txid-000004" in api.runs and "manual__2026" in api.runs["txid-000004"]["note"]
