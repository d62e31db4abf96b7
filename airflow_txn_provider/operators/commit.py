"""The tasks that end a txid's run: ``processed`` (after several jobs) and ``commit``, which
commits its txid in order if its processing task did not (:mod:`airflow_txn_provider.operators.
txn` claims and processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.airflow import AirflowFailException
from airflow_txn_provider.operators.run_retention import prune_airflow_runs
from airflow_txn_provider.operators.txn import TxnOperator
from airflow_txn_provider.rules.waiting import GateState, commit_gate
from airflow_txn_provider.run_context import start_in_triggerer
from airflow_txn_provider.transactions.commit import (
    commit_ready,
    commit_registered,
    record_processed,
)
from airflow_txn_provider.triggers.txn_log import RUN_TXID, WaitFor
from airflow_txn_provider.utils.lineage import lineage_enabled

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_txn_provider.transactions.transaction_log import TransactionLog


class TxnRecordProcessedOperator(TxnOperator):
    """After several jobs of one txid: record the processed output (staged counts)."""

    def execute(self, context: Context) -> str:
        claim = self.claimed(context)
        action = record_processed(
            self.txlog(), self.txn_pipeline.name, claim["txid"], claim["attempt"]
        )
        committed = commit_ready(self.txlog(), self.txn_pipeline, self.log)
        prune_airflow_runs(self.txn_pipeline, self.dag_id, committed, self.log)
        return action


class TxnCommitOperator(TxnOperator):
    """Commit ``(txid, attempt)`` in txid order: wait, deferred, until ``txid - 1`` committed,
    then apply every state and mark it committed, in one DB transaction.

    Usually it finds the txid committed already, by its own processing task or by the commit of
    an earlier txid, which commits the processed txids after it in order. Fenced by the attempt
    and idempotent: a duplicate run applies nothing twice. It fails if the attempt went stale.

    It runs once processing ended, failed tasks too (``trigger_rule="none_skipped"``): a task
    that recorded its output and then could not report success (the api-server away) leaves a
    processed txid that must still commit. Whether the output was recorded is the log's to say.
    Skipped when the claim skipped the run (a rerun of a committed txid).
    """

    commits = True  # its lineage has outputs once its attempt committed

    def __init__(self, *, triggerer_start: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "none_skipped")
        super().__init__(**kwargs)
        if self.txn_pipeline.sinks and not self.outlets:
            # An Asset event per committed txid: downstream DAGs schedule on committed data only.
            self.outlets = self.txn_pipeline.assets
        # Usually the txid committed already (its processing task commits what is ready): the
        # task then ends in the triggerer. It wakes on a worker to commit, to fail a stale
        # attempt, or to emit its Asset events or OpenLineage outputs (a task ending in the
        # triggerer emits none).
        ends_in_triggerer = not self.outlets and not lineage_enabled()
        start_in_triggerer(
            self,
            self.trigger(RUN_TXID, WaitFor.COMMITTED, end_task_on_commit=ends_in_triggerer),
            "execute_complete",
            enabled=triggerer_start,
        )

    def execute(self, context: Context) -> dict[str, Any]:
        return self._commit_or_wait(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the triggerer: ``txid - 1`` committed (or this attempt went stale, or the
        txid committed meanwhile; or, started there, the txid needs this task). The gate is asked
        again: the log, not the event, decides (the event is only checked to be one)."""
        self.resumed_with(event)
        return self._commit_or_wait(context)

    def _commit_or_wait(self, context: Context) -> dict[str, Any]:
        p = self.txn_pipeline
        claim = self.claimed(context, from_log=True)
        txid, attempt = claim["txid"], claim["attempt"]
        txlog = self.txlog()
        gate = commit_gate(txlog.view(p.name), txid, attempt)
        where = f"pipeline={p.name} txid={txid} attempt={attempt}"
        if gate is GateState.STALE:
            raise AirflowFailException(
                f"{where} is no longer current (failed or replaced): it will not commit"
            )
        if gate is GateState.UNFINISHED:
            raise AirflowFailException(
                f"{where}: its processing ended without recording output; the attempt is failed "
                "(by its task's failure or its lease) and the txid replays"
            )
        if gate is GateState.WAIT:
            self.defer(
                trigger=self.trigger(txid, WaitFor.COMMIT_GATE, attempt),
                method_name="execute_complete",
            )
        if gate is GateState.COMMITTED:
            self.log.info("%s committed already", where)
            self._announce(context, txlog, txid)
            return {"applied": False, "also_committed": []}
        result = commit_registered(txlog, p.name, txid, attempt, p.sinks, p.expectations)
        also = commit_ready(txlog, p, self.log)
        prune_airflow_runs(p, self.dag_id, [txid, *also] if result.applied else also, self.log)
        self._announce(context, txlog, txid)
        return {
            "applied": result.applied,
            "committed_attempt": result.committed_attempt,
            "also_committed": also,
        }

    def _announce(self, context: Context, txlog: TransactionLog, txid: int) -> None:
        """The extra of the Asset event this task's success emits: which txid, which version."""
        if not self.txn_pipeline.sinks:
            return
        info = txlog.transaction(self.txn_pipeline.name, txid)
        output = (info.output if info is not None else None) or {}
        for sink, asset in zip(self.txn_pipeline.sinks, self.txn_pipeline.assets, strict=True):
            commit = (output.get(sink.output_key) or {}).get("commit") or {}
            context["outlet_events"][asset].extra = {
                "pipeline": self.txn_pipeline.name,
                "txid": txid,
                "version": commit.get("version"),
                "rows": commit.get("rows", 0),
            }
