"""A note on a txid's run that a person marked success or failed in the UI, saying what the log
says of the txid then (committed already, or in flight and re-queued by the pipeline, or not
begun): the grid never shows a green or red txid run without saying what it meant.

An Airflow listener of the plugin (``TxnProviderPlugin.listeners``). Airflow calls it in the
api-server as the mark is made, inside the request's database session, with the message
"Dag Run's state was manually set to …"; everywhere else (a run that ends by itself, in the
scheduler) it returns at once. Best effort: a log it cannot read leaves the run without a note
(the waker's own note follows when it restarts the run).
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

from airflow_txn_provider.rules.liveness import mark_note
from airflow_txn_provider.timetables import txid_from_run_id

log = logging.getLogger(__name__)

BY_HAND = "state was manually set"
"""What Airflow's message says when a person set the run's state (its REST API, its UI)."""


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    note_mark(dag_run, msg, "success")


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    note_mark(dag_run, msg, "failed")


def note_mark(dag_run: Any, msg: str | None, state: str) -> str | None:
    """Set the note of ``dag_run`` if a person marked it ``state`` and it is a txid's run of a
    transaction pipeline; returns the note (``None``: not one)."""
    if BY_HAND not in (msg or ""):
        return None
    txid = txid_from_run_id(str(getattr(dag_run, "run_id", "")))
    pipeline = _pipeline_of(getattr(dag_run, "dag", None))
    if txid is None or pipeline is None:
        return None
    try:
        # at call time: every Airflow process loads the plugin; the page's access imports FastAPI
        from airflow_txn_provider.ui.access import provider

        note = mark_note(provider.get().view(pipeline), txid, state)
        dag_run.note = note[:1000]  # committed with the request's session, beside the state
    except Exception as err:  # never fail the person's click
        log.warning(
            "pipeline=%s txid=%s: no note on run %s marked %s: %s: %s",
            pipeline,
            txid,
            getattr(dag_run, "run_id", None),
            state,
            type(err).__name__,
            err,
        )
        return None
    log.info("pipeline=%s txid=%s: run marked %s by hand: %s", pipeline, txid, state, note)
    return note


def _pipeline_of(dag: Any) -> str | None:
    """The one pipeline ``dag``'s tasks declare, if it is a transaction DAG."""
    # at call time: every Airflow process loads the plugin; the operators add to that
    from airflow_txn_provider.operators.txn import PIPELINE_FIELD

    names = {getattr(task, PIPELINE_FIELD, None) for task in getattr(dag, "tasks", ()) or ()}
    names = {n for n in names if isinstance(n, str) and n}
    return next(iter(names)) if len(names) == 1 else None


__all__ = ["BY_HAND", "note_mark", "on_dag_run_failed", "on_dag_run_success"]
