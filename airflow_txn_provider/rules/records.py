"""The records the rules read: one attempt of a txid, and a consistent snapshot of a pipeline.

The log builds them from its rows (:mod:`airflow_txn_provider.log.rows`), the rules
(:mod:`airflow_txn_provider.rules.coordinator`, :mod:`airflow_txn_provider.rules.fencing`) decide
from them, and the Airflow side and the Transactions page show them. A snapshot checks the log's
invariants when it is built, so no rule ever reads a log that breaks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_txn_provider.rules.exceptions import CorruptLogError
from airflow_txn_provider.rules.vocabulary import FailureResponse, SourceKind, TxStatus


@dataclass(frozen=True)
class TxRecord:
    """One attempt of a txid as the log sees it: a view holds each txid's current attempt, a
    txid's history all of them."""

    txid: int
    attempt: int
    status: TxStatus
    metadata: Any = None
    output: Mapping[str, Any] | None = None
    failed_by: int | None = None
    """For a failed attempt: the txid whose failure failed it (``txid`` itself if its own)."""
    lease_expires_at: datetime | None = None
    """While processing: until when the attempt's process has proved it is alive (its lease)."""
    lease_holder: str | None = None
    """Who renewed the lease last (a task, a host and a pid): named when the lease runs out."""
    begun_at: datetime | None = None
    """When the attempt was emitted (with ``lease_expires_at``: how long its claim lasted)."""
    response: FailureResponse | None = None
    """Once failed: what the failure sensor decided about it (recorded in a txid's history)."""
    failed_expectation: bool = False
    """Failed at its commit by a ``fail`` expectation (:mod:`~airflow_txn_provider.rules.
    expectations`): a replay would stage the same rows, so the pipeline stops at it at once."""

    @property
    def failed_on_its_own(self) -> bool:
        """Failed by its own processing, not in a cascade from an earlier txid."""
        return self.status is TxStatus.FAILED and self.failed_by in (None, self.txid)


@dataclass(frozen=True)
class PipelineView:
    """A consistent snapshot of one pipeline, read under the pipeline's lock.

    ``in_flight`` holds every allocated txid above ``last_committed``, in order and without gaps.
    The constructor checks the log's invariants and raises :class:`CorruptLogError` if one breaks:
    a corrupt log is reported, never repaired silently.
    """

    pipeline: str
    source_kind: SourceKind
    max_pending: int
    last_committed: int = 0
    last_committed_metadata: Any = None
    in_flight: tuple[TxRecord, ...] = ()
    now: datetime | None = None
    """The log's clock when the view was read: leases are judged by it, never by a worker's."""
    runs_made_through: int = 0
    """The newest txid whose DAG run a claim made ahead of its begin: a hint for who makes runs
    (:func:`~airflow_txn_provider.rules.waiting.runs_to_make`), never for what commits."""
    _by_txid: dict[int, TxRecord] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise CorruptLogError(f"max_pending={self.max_pending} < 1", pipeline=self.pipeline)
        if self.last_committed < 0:
            raise CorruptLogError(
                f"last committed txid {self.last_committed} < 0", pipeline=self.pipeline
            )
        expected = self.last_committed + 1
        for rec in self.in_flight:
            if rec.txid != expected:
                raise CorruptLogError(
                    f"txids in flight must follow the last committed txid {self.last_committed} "
                    f"without gaps; expected txid {expected}, found {rec.txid}",
                    pipeline=self.pipeline,
                    txid=rec.txid,
                    attempt=rec.attempt,
                )
            if rec.attempt < 1:
                raise CorruptLogError(
                    "attempt must be >= 1",
                    pipeline=self.pipeline,
                    txid=rec.txid,
                    attempt=rec.attempt,
                )
            if rec.status is TxStatus.COMMITTED:
                raise CorruptLogError(
                    f"txid is marked committed but the pipeline's last committed txid is "
                    f"{self.last_committed}",
                    pipeline=self.pipeline,
                    txid=rec.txid,
                    attempt=rec.attempt,
                )
            expected += 1
        object.__setattr__(self, "_by_txid", {r.txid: r for r in self.in_flight})

    # -- derived facts ---------------------------------------------------------------------------

    @property
    def oldest_uncommitted(self) -> int:
        return self.last_committed + 1

    @property
    def next_new_txid(self) -> int:
        """The txid the next new batch gets."""
        return self.last_committed + len(self.in_flight) + 1

    @property
    def window(self) -> range:
        """Txids allowed in flight: ``[oldest uncommitted, oldest uncommitted + max_pending)``."""
        return range(self.oldest_uncommitted, self.oldest_uncommitted + self.max_pending)

    def record(self, txid: int) -> TxRecord | None:
        return self._by_txid.get(txid)

    def metadata_before(self, txid: int) -> Any:
        """Metadata of ``txid - 1`` (``None`` before txid 1): where ``txid``'s batch starts."""
        if txid - 1 == self.last_committed:
            return self.last_committed_metadata
        prev = self._by_txid.get(txid - 1)
        return None if prev is None else prev.metadata
