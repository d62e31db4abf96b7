"""Lake sinks: a pipeline's output committed into Delta Lake or Apache Iceberg tables, in txid
order, each txid exactly once (:mod:`airflow_txn_provider.sinks.base` has the protocol)."""

from airflow_txn_provider.sinks.base import (
    LakeSink,
    LakeTable,
    SinkCommit,
    StagedFiles,
    list_staged,
    sink_from_spec,
)
from airflow_txn_provider.sinks.delta import DeltaSink
from airflow_txn_provider.sinks.iceberg import IcebergSink

__all__ = [
    "DeltaSink",
    "IcebergSink",
    "LakeSink",
    "LakeTable",
    "SinkCommit",
    "StagedFiles",
    "list_staged",
    "sink_from_spec",
]
