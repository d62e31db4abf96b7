"""State in Postgres, after Trident's map states, set-based: one round trip per batch.

A :class:`MapState` is a table keyed by one or more columns with one aggregated value per key
(:class:`GlobalState`: a single row). A batch update has two steps:

1. **stage** (processing, txids in parallel): one ``COPY`` of the batch's ``(keys…, delta)`` into
   an UNLOGGED staging table, tagged ``(txid, attempt, job)``; a null key or a null/NaN delta is
   refused first (:class:`MalformedOutputError`);
2. **apply** (in the commit's transaction): one ``INSERT … SELECT … GROUP BY … ON CONFLICT DO
   UPDATE`` by the kind's rule (:mod:`~.kinds`); a stored txid ahead of the log's raises
   :class:`StateAheadOfLogError`, a staged count unlike the recorded one (a crash emptied the
   UNLOGGED table) :class:`StagedOutputMismatchError`.

A :class:`BucketCountState` is *derived*: the commit computes it from the committed values.
"""

from airflow_txn_provider.rules.names import quote_ident
from airflow_txn_provider.rules.vocabulary import StateKind
from airflow_txn_provider.state.backing import KEY_TYPES, VALUE_TYPES
from airflow_txn_provider.state.kinds import rule_for
from airflow_txn_provider.state.maps import (
    ApplyResult,
    BucketCountState,
    GlobalState,
    MapState,
    counted_states,
    load_states,
)
from airflow_txn_provider.state.staging import STAGE_JOB_COLUMN, stage_states

__all__ = [
    "KEY_TYPES",
    "STAGE_JOB_COLUMN",
    "VALUE_TYPES",
    "ApplyResult",
    "BucketCountState",
    "GlobalState",
    "MapState",
    "StateKind",
    "counted_states",
    "load_states",
    "quote_ident",
    "rule_for",
    "stage_states",
]
