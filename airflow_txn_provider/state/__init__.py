"""State in Postgres, after Trident's map states, set-based: one round trip per batch.

A :class:`MapState` is a table keyed by one or more columns with one aggregated value per key; a
:class:`GlobalState` is the same with a single row (Trident's Snapshottable, Storm's global count).
A batch update happens in two steps:

1. **stage** (processing phase, many txids in parallel): the batch's partial results
   ``(keys…, delta)`` go with one ``COPY`` into an UNLOGGED staging table, tagged with the
   ``(txid, attempt, job)`` that produced them. A re-stage by the same job of the same attempt
   replaces its rows; several jobs of one txid may stage into the same state side by side. A null
   key or a null/NaN delta is refused (:class:`MalformedOutputError`) before anything is staged.
2. **apply** (commit phase, in the commit's database transaction, see
   :mod:`airflow_txn_provider.transactions.commit`): one ``INSERT … SELECT … GROUP BY … ON CONFLICT
   DO UPDATE`` folds the attempt's staged rows into the state table, by the rule of the state's kind
   (:mod:`~airflow_txn_provider.state.kinds`: non-transactional, transactional, opaque). For both
   kinds that store a txid, a stored txid *greater* than the current one is an error
   (:class:`StateAheadOfLogError`), as in Trident's OpaqueMap: state and log disagree.

A :class:`BucketCountState` is *derived*: nothing stages into it during processing. It counts the
keys of another (summed) state per bucket of their values, Storm's TransactionalWords' second
state. Its batch can only be computed at commit time, from the committed values just before the
txid applies (processing runs in parallel and cannot see them), so the commit derives it in its
database transaction, before applying the state it is derived from.

Staged rows are counted when staged and counted again when applied; a mismatch (an UNLOGGED table
is emptied by a Postgres crash) raises :class:`StagedOutputMismatchError` instead of committing a
partial batch.

Modules: :mod:`~.maps` (the states users declare, composed of the parts below),
:mod:`~.backing` (a state's tables: DDL, stage, apply, read), :mod:`~.kinds` (one class per kind's
rule), :mod:`~.registry` (which pipeline owns which state), :mod:`~.summary` (a keyed state's key
count, sum and top keys), :mod:`~.undo` (the undo records a rewind restores from) and
:mod:`~.staging` (the value domain, the binary COPY, staging several states at once).
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
