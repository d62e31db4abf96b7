"""The coordinator rules: which transaction may do what, decided from its pipeline's snapshot.

Pure: no I/O, no clock, no Airflow, no SQL. The log
(:mod:`airflow_txn_provider.transactions.transaction_log`) loads a :class:`PipelineView` under a
lock, asks a ``plan_*`` function and writes the answer; rules that need only one txid's record
are the attempt fence's (:mod:`airflow_txn_provider.rules.fencing`). The model is Storm's
transactional topology (``TransactionalSpoutCoordinator``): txids are allocated in order and never
reused, each (re-)emission a new **attempt** that fences the older ones; every txid of the
**window** ``[oldest uncommitted, + max_pending)`` may process at once, but ``k`` commits only
after ``k-1``; a failure of ``k`` fails every later txid in flight, so they re-emit in order (an
opaque source's replay of ``k`` may end elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_txn_provider.rules.config import LEASE_HOLDER_CHARS
from airflow_txn_provider.rules.exceptions import (
    LakeTableOutOfSyncError,
    NotBegunError,
    NotProcessedError,
    OutOfOrderCommitError,
    StaleAttemptError,
)
from airflow_txn_provider.rules.fencing import attempt_is_dead, lease_expired
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import (
    BeginAction,
    CommitAction,
    SinkAction,
    SourceKind,
    TxStatus,
)

# -- begin -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BeginPlan:
    action: BeginAction
    txid: int
    attempt: int | None = None
    """The attempt to emit (``None`` when nothing is emitted)."""
    reuse_metadata: bool = False
    """True: replay the stored metadata (transactional source). False: initialise it anew."""
    prev_metadata: Any = None
    """Metadata of ``txid - 1``, the input of the source's ``initialize_transaction``."""
    invalidate: tuple[int, ...] = ()
    """Txids (this one included) whose live attempts must be failed before emitting."""

    @property
    def emits(self) -> bool:
        """A new attempt is emitted (a ``RESUME`` claims the current one, it emits nothing)."""
        return self.action in (BeginAction.NEW, BeginAction.REPLAY, BeginAction.REEMIT)


def plan_begin(view: PipelineView, txid: int, *, replay: bool = True) -> BeginPlan:
    """Decide what beginning ``txid`` means now (Storm's coordinator emitting a batch).

    :param replay: whether this begin may re-emit a failed attempt (``NOT_REPLAYED`` otherwise).
    """
    if txid < 1:
        raise ValueError(f"txid must be >= 1, got {txid}")
    if txid <= view.last_committed:
        return BeginPlan(BeginAction.ALREADY_COMMITTED, txid)
    prev = view.record(txid - 1)
    if prev is not None and prev.status is TxStatus.FAILED:
        # STORM-1557: metadata of k is initialised only after k-1's current one.
        return BeginPlan(BeginAction.WAIT_PREVIOUS, txid)
    rec = view.record(txid)
    if rec is None:
        if txid > view.next_new_txid:
            return BeginPlan(BeginAction.WAIT_PREVIOUS, txid)
        if txid not in view.window:
            return BeginPlan(BeginAction.WAIT_WINDOW, txid)
        return BeginPlan(BeginAction.NEW, txid, attempt=1, prev_metadata=view.metadata_before(txid))
    reuse = view.source_kind is SourceKind.TRANSACTIONAL
    if rec.status is TxStatus.FAILED:
        if not replay:
            return BeginPlan(BeginAction.NOT_REPLAYED, txid)
        if txid not in view.window:
            # A rewind or a cascade can leave more txids failed than the window holds: they
            # replay in order, each once the window reaches it (max_pending in flight at most).
            return BeginPlan(BeginAction.WAIT_WINDOW, txid)
        return BeginPlan(
            BeginAction.REPLAY,
            txid,
            attempt=rec.attempt + 1,
            reuse_metadata=reuse,
            prev_metadata=view.metadata_before(txid),
        )
    if not lease_expired(rec, view.now):
        return BeginPlan(BeginAction.RESUME, txid, attempt=rec.attempt, reuse_metadata=True)
    if txid not in view.window:
        # Live beyond the window (it was narrowed by a new declaration): its lease's expiry
        # fails it, and it replays once the window reaches it.
        return BeginPlan(BeginAction.WAIT_WINDOW, txid)
    return BeginPlan(
        BeginAction.REEMIT,
        txid,
        attempt=rec.attempt + 1,
        reuse_metadata=reuse,
        prev_metadata=view.metadata_before(txid),
        invalidate=plan_failure(view, txid),
    )


def next_to_begin(view: PipelineView) -> int | None:
    """The txid a coordinator loop should begin next, or ``None`` if it must wait.

    Failed txids come first, oldest first (they replay in order); then a new txid. Either only
    inside the window: however many txids a rewind or a cascade failed, at most ``max_pending``
    are in flight.
    """
    for rec in view.in_flight:
        if rec.status is TxStatus.FAILED:
            return rec.txid if rec.txid in view.window else None
    new = view.next_new_txid
    return new if new in view.window else None


# -- commit ------------------------------------------------------------------------------------


def plan_commit(view: PipelineView, txid: int, attempt: int) -> CommitAction:
    """Decide whether ``(txid, attempt)`` may commit now; raise the typed reason if not."""
    if txid <= view.last_committed:
        return CommitAction.ALREADY_COMMITTED
    rec = view.record(txid)
    if rec is None:
        raise NotBegunError(
            "commit of a txid that was never begun",
            pipeline=view.pipeline,
            txid=txid,
            attempt=attempt,
        )
    if attempt_is_dead(rec, attempt):
        raise StaleAttemptError(
            f"commit refused: the current attempt is {rec.attempt} ({rec.status.value})",
            pipeline=view.pipeline,
            txid=txid,
            attempt=attempt,
        )
    if rec.status is not TxStatus.PROCESSED:
        raise NotProcessedError(
            "commit refused: this attempt has not recorded its processed output",
            pipeline=view.pipeline,
            txid=txid,
            attempt=attempt,
        )
    if txid != view.oldest_uncommitted:
        raise OutOfOrderCommitError(
            f"commit refused: txid {txid - 1} has not committed (last committed txid is "
            f"{view.last_committed})",
            pipeline=view.pipeline,
            txid=txid,
            attempt=attempt,
        )
    return CommitAction.APPLY


def plan_sink_commit(
    table_txid: int,
    txid: int,
    *,
    pipeline: str,
    attempt: int,
    sink: str,
    table_attempt: int | None = None,
    rewound_through: int = 0,
    committed_through: int = 0,
) -> SinkAction:
    """Whether the commit of ``(txid, attempt)`` adds to a lake table whose newest commit by this
    pipeline recorded ``table_txid`` (0: none); ``table_attempt``: the attempt whose commit of
    ``txid`` the table holds (``None``: none, or not asked: it is asked only when the table is at
    ``txid`` or past it).

    The table's own record is the truth for what it holds: a table that holds this very attempt
    of the txid gets nothing twice, even when it holds later txids too, as long as those are
    txids the log committed (``committed_through``: the log's last committed txid, given by a
    fill, whose txids are all committed). A fill from history commits a chunk's txids to the
    table one by one inside one log transaction, so a fill killed mid-chunk leaves the table
    several txids ahead of the output's progress in the log; its retry finds each of them there
    (the committed attempts, by exact replay) and adds the next one after them. A table ahead of
    the log itself is not explained that way (a log reset starts again at attempt 1 of txid 1).

    Otherwise commits are ordered by the log, so a table ahead of the txid being committed holds
    commits the log undid: a rewind's (``rewound_through``, the newest txid a rewind of this
    pipeline failed: :func:`~airflow_txn_provider.rules.history.rewound_through`), which the table
    follows now if the rewind could not, or something else's (another log, a restored table):
    adding would break exactly-once, so that is refused."""
    if (
        table_txid >= txid
        and table_attempt == attempt
        and table_txid <= max(txid, committed_through)
    ):
        return SinkAction.ALREADY_IN_TABLE
    if table_txid == txid:
        return SinkAction.REPLACE
    if txid < table_txid <= rewound_through:
        return SinkAction.REPLACE
    if table_txid > txid:
        raise LakeTableOutOfSyncError(
            f"lake sink {sink!r}: the table already holds txid {table_txid} of this pipeline, "
            f"ahead of the txid being committed; was the table written by another transaction "
            "log, or the log reset?",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    return SinkAction.ADD


def committable(view: PipelineView) -> TxRecord | None:
    """The one transaction that may commit now, if any (oldest uncommitted, processed)."""
    rec = view.record(view.oldest_uncommitted)
    return rec if rec is not None and rec.status is TxStatus.PROCESSED else None


# -- failure and recovery ----------------------------------------------------------------------


def plan_failure(
    view: PipelineView,
    txid: int,
    attempt: int | None = None,
    *,
    of_processing: bool = False,
    reporter: str | None = None,
) -> tuple[int, ...]:
    """Txids whose live attempts a failure of ``(txid, attempt)`` fails, in order.

    ``txid`` itself and every later txid in flight. A failure of a committed txid, or one reported
    by an attempt that is no longer current, invalidates nothing (a late report must not fail the
    attempt that replaced it). ``attempt=None`` fails whatever attempt is current.
    ``of_processing``: the failure is its processing's, reported by its task or job; an attempt
    whose output is recorded already is then kept, and commits.
    ``reporter``: the lease holder name of the process reporting its own processing failure;
    when another process holds the attempt's lease (a later try of the task took the attempt
    over, and Airflow stopped this one), the report fails nothing: the holder's own end, or its
    lease running out, decides.
    """
    if txid <= view.last_committed:
        return ()
    rec = view.record(txid)
    if rec is None:
        raise NotBegunError(
            "failure reported for a txid that was never begun",
            pipeline=view.pipeline,
            txid=txid,
            attempt=attempt,
        )
    if attempt is not None and attempt != rec.attempt:
        return ()
    if reporter is not None and rec.lease_holder not in (None, reporter[:LEASE_HOLDER_CHARS]):
        return ()
    if of_processing and rec.status is TxStatus.PROCESSED:
        # A processing task that failed after its output was recorded (spark-submit exiting
        # non-zero at shutdown, a kill, a lost success report): the output stands and commits.
        # Only the cascade of an earlier txid, or its own failed commit, fails a processed txid.
        return ()
    return tuple(
        r.txid for r in view.in_flight if r.txid >= txid and r.status is not TxStatus.FAILED
    )


def plan_recovery(view: PipelineView) -> tuple[int, ...]:
    """Txids to fail when everything restarts after a crash.

    A ``PROCESSING`` attempt belonged to a process that is gone; it and every later txid are failed
    (so an opaque replay cannot skip records). ``PROCESSED`` txids before it keep their durable
    output and commit as they are.
    """
    for rec in view.in_flight:
        if rec.status is TxStatus.PROCESSING:
            return plan_failure(view, rec.txid)
    return ()


# -- liveness: the lease on a processing attempt -----------------------------------------------


def plan_expiry(view: PipelineView, txid: int, attempt: int) -> tuple[int, ...]:
    """Txids to fail because the lease of ``(txid, attempt)`` ran out: it and every later txid in
    flight (the cascade of :func:`plan_failure`). Nothing while the lease is alive, or once the
    attempt is no longer current (a renewal, a commit or another failure came first)."""
    rec = view.record(txid)
    if rec is None or rec.attempt != attempt or not lease_expired(rec, view.now):
        return ()
    return plan_failure(view, txid, attempt)


def expired_lease(view: PipelineView) -> TxRecord | None:
    """The oldest txid whose processing lost its lease, if any: what a watcher fails first."""
    for rec in view.in_flight:
        if lease_expired(rec, view.now):
            return rec
    return None
