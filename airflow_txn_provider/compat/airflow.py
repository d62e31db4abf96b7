"""What moved between the Airflow minors the provider supports (3.1.1 to 3.3): one place.

- 3.2 moved the task exceptions to ``airflow.sdk.exceptions`` and ``Stats`` to
  ``airflow.sdk.observability`` (set up by the caller); 3.1 has them in ``airflow.exceptions`` and
  ``airflow.stats`` (set up by itself on first use).
- Only from 3.3 on: a task starts in the triggerer (``start_from_trigger``); a process's requests
  to its supervisor are thread-safe, so blocking calls may run in a thread (a trigger's, and
  ``triggers.waker.start_making_runs``); a task asks its supervisor for a run (``TriggerDagRun``,
  not the REST API); ``clearTaskInstances`` takes a ``note`` (3.1 and 3.2 refuse it, 422);
  ``retry_exponential_backoff`` is a multiplier (3.1: a switch). What each costs below 3.3:
  docs/deployment.md, "Supported versions".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import airflow
from packaging.version import Version

__all__ = [
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "CLEAR_TAKES_NOTE",
    "DOUBLING_RETRY_BACKOFF",
    "STARTS_FROM_TRIGGER",
    "SUPERVISOR_COMMS_THREAD_SAFE",
    "TASKS_CREATE_RUNS",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSkipException",
    "DownstreamTasksSkipped",
    "TaskDeferred",
    "legacy_stat_name",
    "run_blocking",
    "stats",
    "trigger_run_from_task",
]

AIRFLOW_VERSION = Version(Version(airflow.__version__).base_version)
AIRFLOW_V_3_2_PLUS = AIRFLOW_VERSION >= Version("3.2")
AIRFLOW_V_3_3_PLUS = AIRFLOW_VERSION >= Version("3.3")

STARTS_FROM_TRIGGER = AIRFLOW_V_3_3_PLUS
"""The scheduler hands a ``start_from_trigger`` task to the triggerer (apache/airflow#55068)."""
CLEAR_TAKES_NOTE = AIRFLOW_V_3_3_PLUS
"""``POST …/clearTaskInstances`` accepts ``note`` (and puts it on the cleared task instances)."""
TASKS_CREATE_RUNS = AIRFLOW_V_3_3_PLUS
"""A running task creates a run through its supervisor (:func:`trigger_run_from_task`)."""


def trigger_run_from_task(
    dag_id: str, run_id: str, *, logical_date: datetime, run_after: datetime
) -> bool:
    """Create run ``run_id`` of ``dag_id`` from a running task, through its supervisor: the
    supervisor's execution-API client and the task's own token do the request (the Task SDK's
    ``TriggerDagRun``, as ``TriggerDagRunOperator`` sends it). False if the run exists; raises
    ``AirflowRuntimeError`` for any other refusal (the api-server's answer in it)."""
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

    answer = task_runner.SUPERVISOR_COMMS.send(
        TriggerDagRun(dag_id=dag_id, run_id=run_id, logical_date=logical_date, run_after=run_after)
    )
    if isinstance(answer, ErrorResponse):
        if answer.error is ErrorType.DAGRUN_ALREADY_EXISTS:
            return False
        raise AirflowRuntimeError(answer)
    return True


def _backoff_is_a_multiplier() -> bool:
    from airflow.sdk.bases.operator import BASEOPERATOR_ARGS_EXPECTED_TYPES

    return BASEOPERATOR_ARGS_EXPECTED_TYPES["retry_exponential_backoff"] is not bool


DOUBLING_RETRY_BACKOFF: float | bool = 2.0 if _backoff_is_a_multiplier() else True
"""A task's ``retry_exponential_backoff`` that doubles its retry delay."""

if AIRFLOW_V_3_2_PLUS:
    from airflow.sdk.exceptions import (
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSkipException,
        DownstreamTasksSkipped,
        TaskDeferred,
    )
else:
    from airflow.exceptions import (  # type: ignore[assignment,no-redef]
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSkipException,
        DownstreamTasksSkipped,
        TaskDeferred,
    )


_T = TypeVar("_T")

SUPERVISOR_COMMS_THREAD_SAFE = AIRFLOW_V_3_3_PLUS
"""A thread of a task or triggerer process may ask its supervisor (a connection, a Variable, a
secret to mask) while another does (see the module's doc)."""


async def run_blocking(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` from a trigger: in a thread where Airflow allows it, else on the event loop
    (which it blocks meanwhile: a REST call, a look at the source)."""
    if SUPERVISOR_COMMS_THREAD_SAFE:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def stats() -> Any:
    """Airflow's ``Stats`` for this process, set up from the ``[metrics]`` section (call it again
    after a fork)."""
    try:
        from airflow.sdk.observability import stats as sdk_stats
    except ImportError:  # 3.1: the core's Stats, which sets itself up per process on first use
        from airflow.stats import Stats

        return Stats
    from airflow.sdk.observability.metrics import stats_utils

    factory = stats_utils.get_stats_factory()
    try:
        sdk_stats.initialize(factory=factory, export_legacy_names=False)
    except TypeError:  # 3.2: no legacy-name switch yet
        sdk_stats.initialize(factory=factory)  # type: ignore[call-arg]
    return sdk_stats


def legacy_stat_name(stats_client: Any, name: str) -> str:
    """``name`` made a valid plain-StatsD name (3.3's Stats normalizes it; 3.1's takes it as is)."""
    normalize = getattr(stats_client, "normalize_name_for_stats", None)
    return normalize(name, log_warning=False) if normalize else name


def warm_execution_api_ssl_context() -> bool:
    """Build, in a process that forks task supervisors, the SSL context each supervisor's
    execution-API client asks for (the Task SDK caches it per process: otherwise each task process
    builds its own, even over plain HTTP). Whether it was built: ``False`` where the Task SDK
    keeps no such cache."""
    try:
        from airflow.sdk.api import client
    except ImportError:
        return False
    build = getattr(client.Client, "_get_ssl_context_cached", None)
    if build is None:
        return False
    # the arguments the client passes, or the cache misses: Airflow 3.3 passes [api] ssl_ca_file,
    # 3.1 and 3.2 certifi's bundle
    if hasattr(client, "API_SSL_CA_FILE_PATH"):
        ca_file = client.API_SSL_CA_FILE_PATH
    else:
        import certifi

        ca_file = certifi.where()
    build(ca_file, getattr(client, "API_SSL_CERT_PATH", None))
    return True
