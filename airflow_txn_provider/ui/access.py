"""Who asks, and what they may read: the dependencies every route of the Transactions page's
app takes (:mod:`airflow_txn_provider.ui.app`, :mod:`airflow_txn_provider.ui.actions`).

Authorisation comes first: :class:`Reading` decides from the auth manager alone, and opens the
transaction log on first use, so a user who may read no DAG never makes it open.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cached_property
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import Depends
from fastapi import Path as PathParam

from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import model, reader
from airflow_txn_provider.ui.errors import AccessDeniedError

provider = reader.LogProvider()


# -- dependencies ------------------------------------------------------------------------------


def get_log() -> TransactionLog:
    """The configured transaction log. Not a dependency: a route opens it through
    :class:`Reading`, only once the user's access lets them read something."""
    return provider.get()


LogOpener = Callable[[], TransactionLog]
PipelineDags = Mapping[str, frozenset[str]]


def log_opener() -> LogOpener:
    """How a route opens the log (tests stand in for it)."""
    return get_log


def dag_pipelines() -> reader.DagPipelines:
    """Which pipelines Airflow's DAGs run now (tests stand in for it)."""
    return reader.airflow_dag_pipelines


def get_pipeline_dags(
    declared: Annotated[reader.DagPipelines, Depends(dag_pipelines)],
) -> Callable[[TransactionLog], PipelineDags]:
    """Which DAGs run which pipeline now, read from an opened log (tests stand in for it)."""
    return lambda txlog: reader.pipeline_dags(txlog, declared)


def auth_manager() -> BaseAuthManager:
    """Airflow's auth manager (a dependency, so that tests can stand in for it)."""
    return get_auth_manager()


def access_for(
    manager: Any, user: Any, pipeline_dags: Callable[[], PipelineDags] | None = None
) -> model.DagAccess:
    """Which pipelines ``user`` may read: all if the auth manager grants reading DAGs without
    naming one, else those run by a DAG in ``get_authorized_dag_ids`` (``pipeline_dags`` says
    which DAGs run which pipeline; read only for such a user)."""
    if manager.is_authorized_dag(method="GET", user=user):
        return model.DagAccess(all_dags=True)
    return model.DagAccess(
        dag_ids=frozenset(manager.get_authorized_dag_ids(user=user, method="GET")),
        pipeline_dags=dict(pipeline_dags() if pipeline_dags is not None else {}),
    )


class Reading:
    """One request's reading: who asks, decided first and without the log (``dag_access``: the
    auth manager's answer), and the log, opened on first use. A route checks ``dag_access``
    before it touches :attr:`txlog`, so a user who may read no DAG never makes it open."""

    def __init__(
        self,
        dag_access: model.DagAccess,
        open_log: LogOpener,
        read_pipeline_dags: Callable[[TransactionLog], PipelineDags],
    ) -> None:
        self.dag_access = dag_access
        self._open_log = open_log
        self._read_pipeline_dags = read_pipeline_dags

    @property
    def reads_no_dag(self) -> bool:
        """The user may read no DAG, so no pipeline: nothing to open the log for."""
        return not self.dag_access.all_dags and not self.dag_access.dag_ids

    @cached_property
    def txlog(self) -> TransactionLog:
        return self._open_log()

    @cached_property
    def pipeline_dags(self) -> PipelineDags:
        """Pipeline -> the DAGs that run it now (opens the log)."""
        return self._read_pipeline_dags(self.txlog)

    @cached_property
    def access(self) -> model.DagAccess:
        """``dag_access`` with the DAGs that run each pipeline, which a user who may not read
        every DAG needs (opens the log for them)."""
        if self.dag_access.all_dags or self.reads_no_dag:
            return self.dag_access
        return replace(self.dag_access, pipeline_dags=dict(self.pipeline_dags))


def get_reading(
    user: GetUserDep,
    manager: Annotated[BaseAuthManager, Depends(auth_manager)],
    open_log: Annotated[LogOpener, Depends(log_opener)],
    read_pipeline_dags: Annotated[
        Callable[[TransactionLog], PipelineDags], Depends(get_pipeline_dags)
    ],
) -> Reading:
    return Reading(access_for(manager, user), open_log, read_pipeline_dags)


ReadingDep = Annotated[Reading, Depends(get_reading)]
PipelineName = Annotated[str, PathParam(min_length=1, max_length=250)]
DagId = Annotated[str, PathParam(min_length=1, max_length=250)]


NOT_YOUR_PIPELINE = "you may not read the DAG of this pipeline, so its transactions are hidden"


def authorized(reading: Reading, pipeline: str) -> TransactionLog:
    """The log, for a user who may read ``pipeline``'s DAG; :class:`AccessDeniedError` otherwise
    (without opening the log for a user who may read no DAG: ``reading.access`` needs it not)."""
    require(reading.access, pipeline)
    return reading.txlog


def require(access: model.DagAccess, pipeline: str) -> None:
    if not access.may_read(pipeline):
        raise AccessDeniedError(NOT_YOUR_PIPELINE, pipeline=pipeline)
