"""Warm task processes: import what a processing task needs once, in the process that forks them.

Airflow's LocalExecutor forks its workers from the scheduler and each worker forks one process per
task (Celery's prefork workers likewise), so what is imported before those forks is loaded in
every task: the Spark Connect client and this provider's job code are not imported per txid.
The package's ``airflow.policy`` entry point (:mod:`airflow_txn_provider.preload_at_start`) runs it
at the start of each Airflow process; ``[txn_provider] preload_task_processes = False`` turns it
off, and calling :func:`warm_task_processes` from ``airflow_local_settings.py`` too is harmless.
It only imports (no connection, no thread: a fork after it is safe), only in ``airflow
scheduler``, ``airflow celery worker`` and the dag-processor (:data:`PARSE_MODULES` only), and
skips the Spark modules without pyspark. docs/airflow.md, "Warm task processes", says what it saves.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

TASK_MODULES = (
    "pyspark.sql.connect.session",
    "pyspark.sql.connect.dataframe",
    "pyspark.sql.connect.functions",
    "pyspark.sql.connect.client.core",
    "airflow_txn_provider.spark.job",
    "airflow_txn_provider.operators.spark_runner",
    "airflow_txn_provider.sources.base",
    "airflow_txn_provider.sources.parquet",
    "airflow_txn_provider.sources.landing",
    "airflow_txn_provider.sources.generated",
    "airflow_txn_provider.transactions.lease",
    "airflow_txn_provider.transactions.commit",
    "airflow_txn_provider.failure_injection",
    "airflow_txn_provider.state",
    # what a processing task still imported itself (a profile of its execute): the footers'
    # reader, the Spark Connect client's gRPC channel
    "pyarrow.parquet",
    "grpc._channel",
    # what every task process still imported itself: Jinja's extensions (Airflow's template
    # environment loads them) and OpenLineage's settings (with that provider installed)
    "jinja2.ext",
    "airflow.providers.openlineage.conf",
)
"""What a processing task imports on its way to its first Spark Connect call."""
PARSE_MODULES = (
    "airflow_txn_provider.dag_builder",
    "airflow_txn_provider.hooks.txn_log",
)
"""What a pipeline's DAG file imports. Airflow parses the file in a process forked per task start
and, in the dag-processor, per task callback: a task that ends in the triggerer (``commit``,
``watch_failures``) has one, so about two per txid. Preloaded, a parse runs the file itself, not
the Postgres provider's import, which was most of it."""


PRELOAD_OPTION = "preload_task_processes"
"""``[txn_provider]`` option: whether Airflow's processes that fork tasks preload (default on)."""


def preload_enabled() -> bool:
    """Whether ``[txn_provider] preload_task_processes`` is on (the default)."""
    from airflow.configuration import conf

    return conf.getboolean("txn_provider", PRELOAD_OPTION, fallback=True)


def warm_at_start(argv: Sequence[str] | None = None) -> list[str]:
    """What Airflow's start runs (the ``airflow.policy`` entry point): :func:`warm_task_processes`
    unless ``[txn_provider] preload_task_processes`` is off. Never raises: a process of Airflow
    must start whatever this finds (it logs why it did not warm)."""
    try:
        if not preload_enabled():
            return []
        return warm_task_processes(argv)
    except Exception as err:  # an import error deep in pyspark must not stop a scheduler
        log.warning("not preloading task modules: %s: %s", type(err).__name__, err)
        return []


def warm_asset_handlers() -> None:
    """Make one Asset, as a pipeline's DAG file does (its waker's): the first Asset of a process
    loads every provider's asset URI handlers and Airflow's asset models, which a forked parse
    would otherwise pay for each time."""
    from airflow.sdk import Asset

    Asset(name="txn:preload", uri="txn-waker://preload")


def task_process_warmth() -> str:
    """Whether this task process started with the Spark Connect client loaded (forked from a
    warmed parent), as a processing task says in its log."""
    if TASK_MODULES[0] in sys.modules:
        return "warm: the Spark Connect client was preloaded by the process that forked this task"
    return (
        "cold: this task process imports the Spark Connect client itself (1-2 s per task): "
        "[txn_provider] preload_task_processes is off, or the process that forked it is not "
        "an Airflow scheduler or Celery worker"
    )


def forks_task_processes(argv: Sequence[str]) -> bool:
    """Whether the Airflow command ``argv`` runs a process that forks task processes."""
    args = [a for a in argv[1:] if not a.startswith("-")]
    return args[:1] == ["scheduler"] or args[:2] == ["celery", "worker"]


def forks_dag_parsers(argv: Sequence[str]) -> bool:
    """Whether the Airflow command ``argv`` is the dag-processor, which forks a process per DAG
    file parse and per batch of task callbacks."""
    args = [a for a in argv[1:] if not a.startswith("-")]
    return args[:1] == ["dag-processor"]


def modules_to_preload(argv: Sequence[str]) -> tuple[str, ...]:
    """What the Airflow process ``argv`` should import before it forks: task processes parse
    their DAG file too; the dag-processor only parses."""
    if forks_task_processes(argv):
        return TASK_MODULES + PARSE_MODULES
    if forks_dag_parsers(argv):
        return PARSE_MODULES
    return ()


def warm_task_processes(argv: Sequence[str] | None = None, *, force: bool = False) -> list[str]:
    """Import what the processes this one forks need (:func:`modules_to_preload`; with ``force``,
    all of it); returns the modules imported. A module that cannot be imported (pyspark not
    installed) is skipped."""
    names = (
        TASK_MODULES + PARSE_MODULES
        if force
        else modules_to_preload(sys.argv if argv is None else argv)
    )
    if not names:
        return []
    started = time.monotonic()
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            log.info("not preloading %s: %s", name, err)
            continue
        done.append(name)
    if done and set(PARSE_MODULES) <= set(done):
        warm_asset_handlers()
    # the REST API's SSL context (a failure sensor's restarts, a claim's runs below Airflow
    # 3.3), and the one each task supervisor's execution-API client builds
    if set(TASK_MODULES) & set(done):
        # at call time: Airflow's settings.initialize() imports this module (the policy entry
        # point) before it sets up logging; these would add to every Airflow process
        from airflow_txn_provider.compat.airflow import warm_execution_api_ssl_context
        from airflow_txn_provider.hooks.airflow_api import shared_ssl_context

        shared_ssl_context()
        warm_execution_api_ssl_context()
    log.info(
        "preloaded %d modules for task processes in %.2f s", len(done), time.monotonic() - started
    )
    return done
