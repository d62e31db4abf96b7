"""What a user may change from the Transactions page's API, not only read: a rewind.

``POST /transactions/api/pipelines/{pipeline}/rewind`` with ``{"to_txid": N}`` (and optionally
``job_version``, ``reason``, ``restart_runs``) rewinds the pipeline to txid N
(:mod:`airflow_txn_provider.transactions.rewind`) and restarts the runs as the failure sensor
does. Only a user who may **edit** every DAG that runs the pipeline may (``is_authorized_dag``
with ``PUT``; all DAGs for a pipeline with no known DAG): reading is not enough (403). It is
written to Airflow's audit log (event :data:`AUDIT_EVENT`, one row per DAG). A JSON body is
required, so a form on another site cannot post one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.rewind import restart_runs
from airflow_txn_provider.rules.exceptions import RewindError
from airflow_txn_provider.transactions.rewind import RewindResult
from airflow_txn_provider.ui.access import PipelineName, ReadingDep, auth_manager, authorized
from airflow_txn_provider.ui.errors import AccessDeniedError

AUDIT_EVENT = "txn_rewind"
"""The event of a rewind's rows in Airflow's audit log."""

router = APIRouter()


class RewindRequest(BaseModel):
    to_txid: int = Field(ge=1, description="the first txid to recompute")
    job_version: str | None = Field(default=None, max_length=200)
    reason: str | None = Field(default=None, max_length=1000)
    restart_runs: bool = True


RunRestarter = Callable[[Iterable[str], RewindResult], list[str]]
AuditLogger = Callable[[Sequence[str], str, dict[str, Any]], None]


def run_restarter() -> RunRestarter:
    """How the route restarts the rewound txids' runs (tests stand in for it): through the
    REST API, as the connection ``airflow_api_default`` says (the failure sensor's)."""

    def restart(dag_ids: Iterable[str], result: RewindResult) -> list[str]:
        return restart_runs(AirflowApiHook(), dag_ids, result)

    return restart


def audit_logger() -> AuditLogger:
    """How the route writes Airflow's audit log (tests stand in for it)."""

    def write(dag_ids: Sequence[str], owner: str, extra: dict[str, Any]) -> None:
        from airflow.models.log import Log
        from airflow.utils.session import create_session

        with create_session() as session:
            targets: list[str | None] = [*dag_ids] or [None]  # no DAG: one row
            for dag_id in targets:
                session.add(
                    Log(event=AUDIT_EVENT, owner=owner, dag_id=dag_id, extra=json.dumps(extra))
                )

    return write


def may_edit(manager: BaseAuthManager, user: Any, dag_ids: Sequence[str]) -> bool:
    """Whether ``user`` may edit every DAG of ``dag_ids`` (all DAGs when there is none)."""
    if not dag_ids:
        return bool(manager.is_authorized_dag(method="PUT", user=user))
    return all(
        manager.is_authorized_dag(method="PUT", user=user, details=DagDetails(id=dag_id))
        for dag_id in dag_ids
    )


NOT_AN_EDITOR = "rewinding needs the right to edit every DAG that runs this pipeline"


@router.post("/api/pipelines/{pipeline}/rewind")
def rewind_api(
    pipeline: PipelineName,
    body: RewindRequest,
    user: GetUserDep,
    reading: ReadingDep,
    manager: Annotated[BaseAuthManager, Depends(auth_manager)],
    restart: Annotated[RunRestarter, Depends(run_restarter)],
    audit: Annotated[AuditLogger, Depends(audit_logger)],
) -> Any:
    txlog = authorized(reading, pipeline)  # may read it, or 403/404 as the page's routes
    dag_ids = sorted(reading.pipeline_dags.get(pipeline, ()))
    if not may_edit(manager, user, dag_ids):
        raise AccessDeniedError(NOT_AN_EDITOR, pipeline=pipeline)
    by = user.get_name()
    try:
        result = txlog.rewind(
            pipeline, body.to_txid, by=by, job_version=body.job_version, reason=body.reason
        )
    except RewindError as err:
        body_409 = {"detail": str(err), "error": type(err).__name__, "pipeline": pipeline}
        return JSONResponse({**body_409, "floor": getattr(err, "floor", None)}, status_code=409)
    summary = {
        "pipeline": pipeline,
        "to_txid": result.to_txid,
        "last_committed_before": result.last_committed_before,
        "rewound": list(result.rewound),
        "states": {name: dict(counts) for name, counts in result.states.items()},
        "tables": dict(result.tables),
        "job_version": body.job_version,
        "reason": body.reason,
    }
    audit(dag_ids, by, summary)
    cleared = restart(dag_ids, result) if body.restart_runs else []
    return {**summary, "by": by, "dag_ids": dag_ids, "restarted": len(cleared)}


__all__ = [
    "AUDIT_EVENT",
    "RewindRequest",
    "audit_logger",
    "may_edit",
    "rewind_api",
    "run_restarter",
]
