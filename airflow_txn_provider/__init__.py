"""Ordered Spark batch transactions on Apache Airflow (Storm's transactional topologies).

The public API is what this module lists in :data:`API`: import it from here,
``from airflow_txn_provider import TxnPipeline, build_dag``. Every other module path is internal
and may change between 0.x versions (CHANGELOG.md says when one did).

Each name is imported on first use (PEP 562), so ``import airflow_txn_provider`` stays cheap: a DAG
file that uses only ``TxnPipeline`` and ``build_dag`` imports neither Spark's sources nor the lake
libraries, and the plugin Airflow loads in every process imports none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

API: dict[str, str] = {
    # a pipeline and its DAG
    "TxnPipeline": "airflow_txn_provider.pipeline",
    "build_dag": "airflow_txn_provider.dag_builder",
    # sources: your own, and Spark's
    "Source": "airflow_txn_provider.rules.sources",
    "TransactionalSource": "airflow_txn_provider.rules.sources",
    "OpaqueSource": "airflow_txn_provider.rules.sources",
    "next_offset_ranges": "airflow_txn_provider.rules.sources",
    "SparkSource": "airflow_txn_provider.sources.base",
    "PartitionedParquetSource": "airflow_txn_provider.sources.parquet",
    "LandingDirectorySource": "airflow_txn_provider.sources.landing",
    "KafkaSource": "airflow_txn_provider.sources.kafka",
    "OpaqueKafkaSource": "airflow_txn_provider.sources.kafka",
    "GeneratedTextSource": "airflow_txn_provider.sources.generated",
    # outputs: Postgres states and lake tables
    "MapState": "airflow_txn_provider.state",
    "GlobalState": "airflow_txn_provider.state",
    "BucketCountState": "airflow_txn_provider.state",
    "DeltaSink": "airflow_txn_provider.sinks",
    "IcebergSink": "airflow_txn_provider.sinks",
    # audit before publish: expectations on a txid's staged output
    "RowCondition": "airflow_txn_provider.rules.expectations",
    "RowCount": "airflow_txn_provider.rules.expectations",
    "RowCountWithinSigma": "airflow_txn_provider.rules.expectations",
    "FailingShare": "airflow_txn_provider.rules.expectations",
    "Check": "airflow_txn_provider.rules.expectations",
    # the core without Airflow
    "TransactionLog": "airflow_txn_provider.transactions.transaction_log",
    "LeaseKeeper": "airflow_txn_provider.transactions.lease",
    "stage_states": "airflow_txn_provider.state",
    "txid_changes": "airflow_txn_provider.state.as_of",
    "commit_states": "airflow_txn_provider.transactions.commit",
    "fill_pipeline": "airflow_txn_provider.spark.fill",
    "run_job": "airflow_txn_provider.spark.job",
    # Airflow
    "TxnLogHook": "airflow_txn_provider.hooks.txn_log",
    "warm_task_processes": "airflow_txn_provider.preload",
    # errors (all of them in airflow_txn_provider.rules.exceptions, each a TxnError)
    "TxnError": "airflow_txn_provider.rules.exceptions",
    "PipelineConfigError": "airflow_txn_provider.rules.exceptions",
    "OutputStartRequiredError": "airflow_txn_provider.rules.exceptions",
    "FillRefusedError": "airflow_txn_provider.rules.exceptions",
    "MalformedRecordError": "airflow_txn_provider.rules.exceptions",
    "MalformedOutputError": "airflow_txn_provider.rules.exceptions",
    "PoisonBatchError": "airflow_txn_provider.rules.exceptions",
    "ExpectationsFailedError": "airflow_txn_provider.rules.exceptions",
    "RewindError": "airflow_txn_provider.rules.exceptions",
    "StateTxidNotReadableError": "airflow_txn_provider.rules.exceptions",
}
"""Each public name and the module it is defined in."""

__all__ = sorted(API)

if TYPE_CHECKING:  # what type checkers see (``X as X``: re-exported); a test keeps it = API
    from airflow_txn_provider.dag_builder import build_dag as build_dag
    from airflow_txn_provider.hooks.txn_log import TxnLogHook as TxnLogHook
    from airflow_txn_provider.pipeline import TxnPipeline as TxnPipeline
    from airflow_txn_provider.preload import warm_task_processes as warm_task_processes
    from airflow_txn_provider.rules.exceptions import (
        ExpectationsFailedError as ExpectationsFailedError,
    )
    from airflow_txn_provider.rules.exceptions import FillRefusedError as FillRefusedError
    from airflow_txn_provider.rules.exceptions import MalformedOutputError as MalformedOutputError
    from airflow_txn_provider.rules.exceptions import MalformedRecordError as MalformedRecordError
    from airflow_txn_provider.rules.exceptions import (
        OutputStartRequiredError as OutputStartRequiredError,
    )
    from airflow_txn_provider.rules.exceptions import PipelineConfigError as PipelineConfigError
    from airflow_txn_provider.rules.exceptions import PoisonBatchError as PoisonBatchError
    from airflow_txn_provider.rules.exceptions import RewindError as RewindError
    from airflow_txn_provider.rules.exceptions import (
        StateTxidNotReadableError as StateTxidNotReadableError,
    )
    from airflow_txn_provider.rules.exceptions import TxnError as TxnError
    from airflow_txn_provider.rules.expectations import Check as Check
    from airflow_txn_provider.rules.expectations import FailingShare as FailingShare
    from airflow_txn_provider.rules.expectations import RowCondition as RowCondition
    from airflow_txn_provider.rules.expectations import RowCount as RowCount
    from airflow_txn_provider.rules.expectations import (
        RowCountWithinSigma as RowCountWithinSigma,
    )
    from airflow_txn_provider.rules.sources import OpaqueSource as OpaqueSource
    from airflow_txn_provider.rules.sources import Source as Source
    from airflow_txn_provider.rules.sources import TransactionalSource as TransactionalSource
    from airflow_txn_provider.rules.sources import next_offset_ranges as next_offset_ranges
    from airflow_txn_provider.sinks import DeltaSink as DeltaSink
    from airflow_txn_provider.sinks import IcebergSink as IcebergSink
    from airflow_txn_provider.sources.base import SparkSource as SparkSource
    from airflow_txn_provider.sources.generated import (
        GeneratedTextSource as GeneratedTextSource,
    )
    from airflow_txn_provider.sources.kafka import KafkaSource as KafkaSource
    from airflow_txn_provider.sources.kafka import OpaqueKafkaSource as OpaqueKafkaSource
    from airflow_txn_provider.sources.landing import (
        LandingDirectorySource as LandingDirectorySource,
    )
    from airflow_txn_provider.sources.parquet import (
        PartitionedParquetSource as PartitionedParquetSource,
    )
    from airflow_txn_provider.spark.fill import fill_pipeline as fill_pipeline
    from airflow_txn_provider.spark.job import run_job as run_job
    from airflow_txn_provider.state import BucketCountState as BucketCountState
    from airflow_txn_provider.state import GlobalState as GlobalState
    from airflow_txn_provider.state import MapState as MapState
    from airflow_txn_provider.state import stage_states as stage_states
    from airflow_txn_provider.state.as_of import txid_changes as txid_changes
    from airflow_txn_provider.transactions.commit import commit_states as commit_states
    from airflow_txn_provider.transactions.lease import LeaseKeeper as LeaseKeeper
    from airflow_txn_provider.transactions.transaction_log import TransactionLog as TransactionLog


def __getattr__(name: str) -> Any:
    module = API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
