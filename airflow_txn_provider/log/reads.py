"""The log's reads: what the Transactions page, the operators and the failure sensor look at.

The pipelines, a pipeline's snapshot, its txids and each txid's attempts, read without a lock: a
read never waits for a commit and never holds one up. Nothing here writes.
:class:`LogReads` is a part of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from airflow_txn_provider.log.models import ATTEMPTS, PIPELINES, TRANSACTIONS
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import load_view, naming_pipeline
from airflow_txn_provider.rules.exceptions import UnknownPipelineError
from airflow_txn_provider.rules.expectations import failed_a_fail_expectation
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import FailureResponse, TxStatus
from airflow_txn_provider.utils.retries import retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

SNAPSHOT = "REPEATABLE READ"
"""Isolation level of unlocked reads of a pipeline: its statements see one snapshot."""


@dataclass(frozen=True)
class TransactionInfo:
    pipeline: str
    txid: int
    attempt: int
    status: TxStatus
    metadata: Any
    output: Any
    last_error: str | None
    begun_at: datetime | None
    processed_at: datetime | None
    committed_at: datetime | None
    failed_by: int | None = None
    """While failed: the txid whose failure failed this one (itself if its own)."""
    lease_expires_at: datetime | None = None
    lease_holder: str | None = None


@dataclass(frozen=True)
class AttemptInfo:
    pipeline: str
    txid: int
    attempt: int
    status: TxStatus
    metadata: Any
    output: Any
    error: str | None
    started_at: datetime | None
    processed_at: datetime | None
    ended_at: datetime | None
    failed_by: int | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds per phase: ``start``, ``connect``, ``spark``, ``staging``, ``commit``."""
    response: FailureResponse | None = None
    """Once failed: what the failure sensor did about it (re-queue, leave, stop the pipeline)."""
    expectations: Sequence[Mapping[str, Any]] = ()
    """Each expectation's outcome as its commit judged it (:func:`~airflow_txn_provider.rules.
    expectations.outcome_record`)."""


class LogReads(LogPart):
    """Reading the log: pipelines, a pipeline's snapshot, its txids and their attempts."""

    @retry_transient
    def pipelines(self) -> list[str]:
        """Names of every registered pipeline, sorted (one query, no lock). Names only: reading
        a pipeline (``view``) is where a corrupt row is reported, for that pipeline alone."""
        with self.engine.connect() as conn:
            return list(conn.execute(select(PIPELINES.c.name).order_by(PIPELINES.c.name)).scalars())

    @retry_transient
    def view(self, pipeline: str) -> PipelineView:
        """A consistent snapshot of the pipeline (no lock is held after it returns)."""
        # Two statements read it (pipeline row, then txid rows): without one snapshot for both, a
        # commit landing between them looks like a corrupt log (a committed txid in flight).
        with self.engine.connect().execution_options(isolation_level=SNAPSHOT) as conn:
            return load_view(conn, pipeline, lock=False)

    @retry_transient
    def last_committed(self, pipeline: str) -> int:
        with self.engine.connect() as conn:
            value = conn.execute(
                select(PIPELINES.c.last_committed_txid).where(PIPELINES.c.name == pipeline)
            ).scalar_one_or_none()
        if value is None:
            raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
        return int(value)

    @retry_transient
    def transactions(
        self, pipeline: str, *, since_txid: int = 0, limit: int | None = None
    ) -> list[TransactionInfo]:
        """Txids of the pipeline above ``since_txid``, oldest first."""
        query = (
            select(TRANSACTIONS)
            .where(TRANSACTIONS.c.pipeline == pipeline, TRANSACTIONS.c.txid > since_txid)
            .order_by(TRANSACTIONS.c.txid)
            .limit(limit)
        )
        with self.engine.connect() as conn, naming_pipeline(pipeline):
            rows = conn.execute(query).all()
        return [
            TransactionInfo(
                pipeline=r.pipeline,
                txid=r.txid,
                attempt=r.attempt,
                status=r.status,
                metadata=r.metadata,
                output=r.output,
                last_error=r.last_error,
                begun_at=r.begun_at,
                processed_at=r.processed_at,
                committed_at=r.committed_at,
                failed_by=r.failed_by,
                lease_expires_at=r.lease_expires_at,
                lease_holder=r.lease_holder,
            )
            for r in rows
        ]

    def transaction(self, pipeline: str, txid: int) -> TransactionInfo | None:
        """One txid's current attempt, or ``None`` if it was never begun."""
        found = self.transactions(pipeline, since_txid=txid - 1, limit=1)
        return found[0] if found and found[0].txid == txid else None

    @retry_transient
    def attempts(self, pipeline: str, txid: int) -> list[AttemptInfo]:
        """Every attempt of ``txid``, oldest first: the history behind each replay."""
        return [
            AttemptInfo(
                pipeline=r.pipeline,
                txid=r.txid,
                attempt=r.attempt,
                status=r.status,
                metadata=r.metadata,
                output=r.output,
                error=r.error,
                started_at=r.started_at,
                processed_at=r.processed_at,
                ended_at=r.ended_at,
                failed_by=r.failed_by,
                timings=dict(r.timings or {}),
                response=r.response,
                expectations=tuple(r.expectations or ()),
            )
            for r in self._attempt_rows(pipeline, txid)
        ]

    @retry_transient
    def history(self, pipeline: str, txid: int) -> tuple[TxRecord, ...]:
        """Every attempt of ``txid`` as the coordinator's records, oldest first: what the failure
        sensor's rules (:func:`~airflow_txn_provider.rules.waiting.respond_to_failure`) read."""
        return tuple(
            TxRecord(
                txid=int(r.txid),
                attempt=int(r.attempt),
                status=r.status,
                failed_by=r.failed_by,
                response=r.response,
                failed_expectation=failed_a_fail_expectation(r.expectations),
            )
            for r in self._attempt_rows(pipeline, txid)
        )

    def _attempt_rows(self, pipeline: str, txid: int) -> Sequence[Row[Any]]:
        with self.engine.connect() as conn, naming_pipeline(pipeline):
            return conn.execute(
                select(ATTEMPTS)
                .where(ATTEMPTS.c.pipeline == pipeline, ATTEMPTS.c.txid == txid)
                .order_by(ATTEMPTS.c.attempt)
            ).all()
