"""The run keeper: every txid in flight keeps a DAG run whose tasks can move it.

What the waker does through Airflow's REST API (blocking: it calls it in a thread), whatever a
person clicked in the UI; each answer comes from looking at Airflow, never from trusting it:

* :func:`ensure_txid_run`: the run of a txid due to begin. A 409 means the run exists or another
  run (a person's "Trigger DAG") holds the txid's logical date: its own run ended by hand is
  restarted; another is deleted once it has ended, and the txid's run created.
* :func:`keep_alive`: the run of a txid that waits for a task
  (:mod:`airflow_txn_provider.rules.liveness`): a task or run marked success or failed has the
  task cleared; a deleted run is created again.

Each action leaves a note on the run, saying what the log showed and what was done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow_txn_provider.rules.liveness import Need
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.timetables import txid_logical_date, txid_run_id

log = logging.getLogger(__name__)

ALIVE_RUN_STATES = frozenset({"queued", "running"})
ENDED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
"""Task states in which a task does nothing more unless it is cleared."""


def ensure_txid_run(api: Any, dag_id: str, txid: int) -> tuple[bool, str]:
    """Make sure txid ``txid`` (due to begin) has a run that will claim it: create it, or find it
    alive, or restart it (ended by hand before it claimed), or free its slot. Returns whether
    that is done, and what was found or done (a line for the log; when not done, the trouble
    the health endpoint reports)."""
    if api.create_txid_run(dag_id, txid):
        return True, "new data: its DAG run is created"
    run_id = txid_run_id(txid)
    run = api.dag_run(dag_id, run_id)
    if run is not None:
        if run.get("state") in ALIVE_RUN_STATES:
            return True, "its run exists"
        tasks = sorted({ti["task_id"] for ti in api.task_instances(dag_id, run_id)})
        note = (
            f"txid {txid}: this run was marked {run.get('state')} before it began the txid: "
            "restarted by the pipeline (the txid has not begun yet)"
        )
        _restart(api, dag_id, run_id, tasks, note)
        return True, note
    holder = api.run_at(dag_id, txid_logical_date(txid))
    if holder is None:  # deleted since the 409: create it now
        made = api.create_txid_run(dag_id, txid)
        return made, "its run is created" if made else "its run could not be created (409)"
    held_by = f"run {holder['dag_run_id']!r} ({holder.get('state')})"
    if holder.get("state") in ALIVE_RUN_STATES:
        return False, (
            f"txid {txid}'s run cannot be created: {held_by} holds its logical date "
            f"{txid_logical_date(txid).isoformat()}; it is no transaction and is deleted once "
            "it ends"
        )
    api.delete_dag_run(dag_id, holder["dag_run_id"])
    if not api.create_txid_run(dag_id, txid):
        return False, f"txid {txid}'s run could not be created after deleting {held_by}"
    note = (
        f"txid {txid}: {held_by} held this txid's logical date; it was no transaction (a manual "
        "trigger), so the pipeline deleted it and created this run"
    )
    api.set_run_note(dag_id, run_id, note)
    return True, note


def keep_alive(
    api: Any,
    dag_id: str,
    rec: TxRecord,
    need: Need,
    *,
    watch_task: str,
    commit_task: str,
) -> str | None:
    """Restart what txid ``rec.txid``'s run lacks for ``need``: the run if it was deleted, the
    task if it ended (marked by hand, or its retries spent). Returns what was done (also the
    run's note), or ``None`` when the run's tasks are alive and nothing was needed."""
    txid = rec.txid
    run_id = txid_run_id(txid)
    where = _what_the_log_shows(rec, need)
    run = api.dag_run(dag_id, run_id)
    if run is None:
        done, said = ensure_txid_run(api, dag_id, txid)
        if not done:
            return said
        note = f"{where}, and its run was deleted: the pipeline created it again"
        api.set_run_note(dag_id, run_id, note)
        return note
    wanted = [watch_task, commit_task] if need is Need.COMMIT else [watch_task]
    states = {ti["task_id"]: ti.get("state") for ti in api.task_instances(dag_id, run_id)}
    run_ended = run.get("state") not in ALIVE_RUN_STATES
    ended = [t for t in wanted if states.get(t) in ENDED_TASK_STATES]
    if not ended and not run_ended:
        return None
    restart = ended or wanted
    if run_ended:
        what = f"this run was marked {run.get('state')}"
    else:
        what = "its task " + ", ".join(f"{t} was marked {states.get(t)}" for t in ended)
    then = "it commits" if need is Need.COMMIT else "it re-queues the txid, in order"
    note = f"{where}, but {what}: the pipeline restarted {', '.join(restart)} ({then})"
    _restart(api, dag_id, run_id, restart, note, reset_run=run_ended)
    return note


def _what_the_log_shows(rec: TxRecord, need: Need) -> str:
    head = f"txid {rec.txid} attempt {rec.attempt}"
    if need is Need.COMMIT:
        return f"{head} is processed and next to commit"
    if rec.status is TxStatus.FAILED:
        return f"{head} failed and waits for its failure sensor"
    return f"{head} was processing and its lease ran out"


def _restart(
    api: Any,
    dag_id: str,
    run_id: str,
    tasks: Sequence[str],
    note: str,
    *,
    reset_run: bool = True,
) -> None:
    """Clear ``tasks`` of one run (a finished run back in the queue), then say why on it."""
    api.clear_task_instances(dag_id, tasks, run_id=run_id, note=note, reset_dag_runs=reset_run)
    api.set_run_note(dag_id, run_id, note)
    log.warning("dag=%s run=%s: %s", dag_id, run_id, note)


__all__ = ["ALIVE_RUN_STATES", "ENDED_TASK_STATES", "ensure_txid_run", "keep_alive"]
