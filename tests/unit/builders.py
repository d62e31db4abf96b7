"""Plain-value builders of pipeline views, shared by the tests of the rules and of the waiting
policy (not a test module: tests import from here, never from each other)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import SourceKind, TxStatus

PROC, DONE, FAIL = TxStatus.PROCESSING, TxStatus.PROCESSED, TxStatus.FAILED


def view(
    *records: tuple[int, int, TxStatus],
    last: int = 0,
    max_pending: int = 4,
    kind: SourceKind = SourceKind.TRANSACTIONAL,
    runs_made_through: int = 0,
) -> PipelineView:
    return PipelineView(
        pipeline="p",
        source_kind=kind,
        max_pending=max_pending,
        runs_made_through=runs_made_through,
        last_committed=last,
        last_committed_metadata={"end": last * 10} if last else None,
        in_flight=tuple(
            TxRecord(t, a, s, metadata={"end": t * 10}, output={"n": t} if s is DONE else None)
            for t, a, s in records
        ),
    )


NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def leased(
    records: tuple[tuple[int, int, TxStatus, float | None], ...], *, last: int = 0
) -> PipelineView:
    """A view at ``NOW`` whose records' leases end ``seconds`` from ``NOW`` (``None``: none)."""
    return PipelineView(
        pipeline="p",
        source_kind=SourceKind.TRANSACTIONAL,
        max_pending=4,
        last_committed=last,
        in_flight=tuple(
            TxRecord(
                t,
                a,
                s,
                lease_expires_at=None if secs is None else NOW + timedelta(seconds=secs),
            )
            for t, a, s, secs in records
        ),
        now=NOW,
    )
