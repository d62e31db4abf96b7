"""Whether a pipeline is healthy: the rule behind the plugin's health endpoint.

``GET /transactions/api/health`` (:mod:`airflow_txn_provider.ui.app`) serves load balancers and
monitors. Pure: it judges what the log says, read by :func:`read_health`. A pipeline is
**stalled** when txids wait to commit and nothing has moved for ``stall_after`` seconds (no
commit, and its oldest uncommitted txid began before then), or after ``STUCK_AFTER`` seconds for
what never mends by waiting: a txid past its lease that nobody expired, or the waker's *run
trouble* (:mod:`airflow_txn_provider.triggers.waker`); ``reason`` says which. With nothing
uncommitted it is **idle**, otherwise **ok**. Each output says from which txid it is complete
(``"partial": true`` for one added to the running pipeline).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.log.models import ATTEMPTS, PIPELINES, TRANSACTIONS
from airflow_txn_provider.log.outputs import read_completeness
from airflow_txn_provider.rules.vocabulary import TxStatus

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_txn_provider.rules.records import PipelineView, TxRecord
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

STUCK_AFTER = 30.0
"""Seconds past a lease, or of run trouble, after which a pipeline is stalled."""
STALL_AFTER = 600.0
"""Seconds without progress after which a pipeline with uncommitted txids is stalled (the
endpoint's default; ``?stall_after=`` changes it per request)."""


class Health(StrEnum):
    OK = "ok"
    IDLE = "idle"
    STALLED = "stalled"


@dataclass(frozen=True)
class PipelineHealth:
    pipeline: str
    status: Health
    last_committed: int
    newest_txid: int
    """The newest txid begun."""
    lag_processed: int
    """Processed txids waiting to commit: the newest processed minus the last committed."""
    lag_begun: int
    """Txids begun and not committed: the newest begun minus the last committed."""
    last_commit_age: float | None
    """Seconds since the last commit (``None``: none yet, or its row was pruned)."""
    stalled_for: float | None
    """Seconds without progress while txids wait (``None``: nothing waits)."""
    oldest_failed: int | None
    """The oldest txid whose current attempt failed (waiting for a replay), if any."""
    reason: str | None = None
    """Why it is stalled, in words."""
    outputs: tuple[dict[str, Any], ...] = ()
    """Each output (state, lake sink) and from which txid it is complete
    (:func:`airflow_txn_provider.rules.outputs.completeness`)."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def newest_processed(last_committed: int, in_flight: Iterable[TxRecord]) -> int:
    """The newest txid whose processing finished (processed or committed)."""
    processed = [r.txid for r in in_flight if r.status is TxStatus.PROCESSED]
    return max([last_committed, *processed])


def health_of(
    view: PipelineView,
    *,
    last_commit_at: datetime | None,
    pending_since: datetime | None,
    now: datetime,
    stall_after: float = STALL_AFTER,
    run_trouble: tuple[str, datetime] | None = None,
) -> PipelineHealth:
    """The health of ``view``'s pipeline at ``now`` (the log's clock). ``last_commit_at``: when
    the last committed txid committed; ``pending_since``: when the oldest uncommitted txid's
    first attempt began; ``run_trouble``: the waker's trouble and since when, if any."""
    waiting = view.in_flight
    failed = [r.txid for r in waiting if r.status is TxStatus.FAILED]
    age = None if last_commit_at is None else (now - last_commit_at).total_seconds()
    stalled_for = None
    status = Health.IDLE
    if waiting:
        moved = [t for t in (last_commit_at, pending_since) if t is not None]
        stalled_for = (now - max(moved)).total_seconds() if moved else 0.0
        status = Health.STALLED if stalled_for > stall_after else Health.OK
    reason = None
    if status is Health.STALLED:
        reason = f"nothing has moved for {stalled_for:.0f} s while txids wait"
    for rec in waiting:
        past = _past_lease(rec, now)
        if past is not None and past > STUCK_AFTER:
            status = Health.STALLED
            reason = (
                f"txid {rec.txid} attempt {rec.attempt} is processing {past:.0f} s past its "
                f"lease ({rec.lease_holder or 'no holder'}) and nobody expired it: its run's "
                "failure sensor is gone"
            )
            break
    if run_trouble is not None and (now - run_trouble[1]).total_seconds() > STUCK_AFTER:
        status, reason = Health.STALLED, run_trouble[0]
    return PipelineHealth(
        pipeline=view.pipeline,
        status=status,
        last_committed=view.last_committed,
        newest_txid=waiting[-1].txid if waiting else view.last_committed,
        lag_processed=newest_processed(view.last_committed, waiting) - view.last_committed,
        lag_begun=len(waiting),
        last_commit_age=age,
        stalled_for=stalled_for,
        oldest_failed=failed[0] if failed else None,
        reason=reason,
    )


def _past_lease(rec: TxRecord, now: datetime) -> float | None:
    """Seconds a processing attempt is past its lease, or ``None``."""
    if rec.status is not TxStatus.PROCESSING or rec.lease_expires_at is None:
        return None
    past = (now - rec.lease_expires_at).total_seconds()
    return past if past >= 0 else None


def read_run_trouble(conn: Connection, pipeline: str) -> tuple[str, datetime] | None:
    """The pipeline's run trouble and since when (see the module's doc), if any."""
    from sqlalchemy import select

    row = conn.execute(
        select(PIPELINES.c.run_trouble, PIPELINES.c.run_trouble_since).where(
            PIPELINES.c.name == pipeline
        )
    ).first()
    if row is None or row[0] is None or row[1] is None:
        return None
    return str(row[0]), row[1]


def progress_times(conn: Connection, view: PipelineView) -> tuple[datetime | None, datetime | None]:
    """What :func:`health_of` reads besides the view: when the last committed txid committed
    (``None``: none yet, or pruned), and when the oldest uncommitted txid's first attempt
    began."""
    from sqlalchemy import func, select

    last_commit_at = None
    if view.last_committed:
        last_commit_at = conn.execute(
            select(TRANSACTIONS.c.committed_at).where(
                (TRANSACTIONS.c.pipeline == view.pipeline)
                & (TRANSACTIONS.c.txid == view.last_committed)
            )
        ).scalar_one_or_none()
    pending_since = None
    if view.in_flight:
        pending_since = conn.execute(
            select(func.min(ATTEMPTS.c.started_at)).where(
                (ATTEMPTS.c.pipeline == view.pipeline)
                & (ATTEMPTS.c.txid == view.oldest_uncommitted)
            )
        ).scalar_one_or_none()
    return last_commit_at, pending_since


def health_from_log(
    conn: Connection, view: PipelineView, now: datetime, stall_after: float = STALL_AFTER
) -> PipelineHealth:
    """:func:`health_of` ``view``, with what it needs besides read from ``conn`` (its clock where
    the view gives one, else ``now``)."""
    last_commit_at, pending_since = progress_times(conn, view)
    return health_of(
        view,
        last_commit_at=last_commit_at,
        pending_since=pending_since,
        now=view.now or now,
        stall_after=stall_after,
        run_trouble=read_run_trouble(conn, view.pipeline),
    )


def read_health(
    txlog: TransactionLog, pipeline: str, now: datetime, stall_after: float = STALL_AFTER
) -> PipelineHealth:
    """The health of ``pipeline`` as the log has it now (its clock where it gives one)."""
    view = txlog.view(pipeline)
    with txlog.engine.connect() as conn:
        judged = health_from_log(conn, view, now, stall_after)
        outputs = tuple(read_completeness(conn, pipeline))
    return replace(judged, outputs=outputs)


__all__ = [
    "STALL_AFTER",
    "STUCK_AFTER",
    "Health",
    "PipelineHealth",
    "health_from_log",
    "health_of",
    "newest_processed",
    "progress_times",
    "read_health",
    "read_run_trouble",
]
