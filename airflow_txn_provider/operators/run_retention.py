"""Retention on Airflow's side: a commit task deletes the DAG runs of txids the log no longer
keeps, through the REST API (the log's own retention is :mod:`airflow_txn_provider.transactions.
retention`; when, :func:`~airflow_txn_provider.rules.history.airflow_runs_prune_due`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.rules.history import airflow_runs_prune_due, retention_horizon

if TYPE_CHECKING:
    from airflow_txn_provider.pipeline import TxnPipeline

RUN_PRUNE_BATCH = 50
"""At most this many old DAG runs are deleted by one commit task (one request each)."""
RUN_PRUNE_TIMEOUT = 10.0
"""Seconds the run pruning waits for the api-server: it is best effort, the commit is done."""


def prune_airflow_runs(
    txn_pipeline: TxnPipeline, dag_id: str, committed: Sequence[int], logger: Any
) -> list[str]:
    """Retention on Airflow's side: after a task committed ``committed``, delete the finished DAG
    runs (with their task instances and XComs) of txids older than the newest
    ``pipeline.keep_txids`` committed ones, through the REST API, at most ``RUN_PRUNE_BATCH``.
    Only every ``PRUNE_EVERY`` txids (one list request and a few deletes, not a request per
    commit). Best effort: never raises (a commit must never fail for it); a failure is a warning
    and the next prune deletes what this one left. The timetable derives the next run from the
    newest run only, so deleting old runs never makes Airflow create them again."""
    if not airflow_runs_prune_due(committed):
        return []
    through = retention_horizon(max(committed), txn_pipeline.keep_txids)
    if through < 1:
        return []
    try:
        hook = AirflowApiHook(
            txn_pipeline.airflow_api_conn_id,
            timeout=RUN_PRUNE_TIMEOUT,
            outage_timeout=RUN_PRUNE_TIMEOUT,
        )
        deleted = hook.prune_txid_runs(dag_id, through, limit=RUN_PRUNE_BATCH)
    except Exception as err:
        logger.warning(
            "pipeline=%s: retention could not delete DAG runs of txids up to %s (retried at a "
            "later commit): %s",
            txn_pipeline.name,
            through,
            err,
        )
        return []
    if deleted:
        logger.info(
            "pipeline=%s retention deleted %d DAG run(s): %s … %s",
            txn_pipeline.name,
            len(deleted),
            deleted[0],
            deleted[-1],
        )
    return deleted
