"""The coordinator rules: every decision about which transaction may do what, and nothing else.

This module is pure: no I/O, no clock, no Airflow, no SQL. The Postgres transaction log
(:mod:`airflow_txn_provider.transaction_log`) loads a :class:`PipelineView` under a lock, asks
one of the ``plan_*`` functions below, and writes the answer. Keeping the rules here means each
one lives in exactly one place and is tested with plain values.

The model is Storm's transactional topology (``TransactionalSpoutCoordinator``):

* txids 1, 2, 3, … are allocated in order and never reused; each (re-)emission of a txid gets a new
  **attempt**, which fences every older attempt of that txid;
* txids in flight form the **window** ``[oldest uncommitted, oldest uncommitted + max_pending)``;
* processing may run for every txid in the window at once, but txid ``k`` commits only after ``k-1``
  committed;
* a failure of txid ``k`` fails ``k`` and every later txid in flight, so they re-emit with new
  attempts in order (for an opaque source a replay of ``k`` may end elsewhere, and a later txid that
  kept its old start would skip or repeat records).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_txn_provider.exceptions import (
    ConflictingOutputError,
    CorruptLogError,
    LakeTableOutOfSyncError,
    NotBegunError,
    NotProcessedError,
    OutOfOrderCommitError,
    StaleAttemptError,
)


class TxStatus(enum.StrEnum):
    """Status of a txid's *current* attempt."""

    PROCESSING = "processing"
    """Emitted: metadata initialised, processing in flight."""
    PROCESSED = "processed"
    """The current attempt's processed output is recorded; it waits for its turn to commit."""
    COMMITTED = "committed"
    """Final. The txid is never processed or committed again."""
    FAILED = "failed"
    """The current attempt is dead; the txid waits to be re-emitted with a new attempt."""


class SourceKind(enum.StrEnum):
    """How a source replays a txid (Storm's transactional vs opaque spouts)."""

    TRANSACTIONAL = "transactional"
    """A txid's batch never changes: its metadata is stored at first emission and reused."""
    OPAQUE = "opaque"
    """A replay may differ: its metadata is recomputed from where the previous txid ended."""


class StateKind(enum.StrEnum):
    """How a state applies a replayed txid (Trident's map states; the rules are in
    :mod:`airflow_txn_provider.state.kinds`)."""

    NON_TRANSACTIONAL = "non_transactional"
    """Adds every batch it is given: exactly once only with the log's commit in one transaction."""
    TRANSACTIONAL = "transactional"
    """Stores the txid with the value and skips a txid it applied: for transactional sources."""
    OPAQUE = "opaque"
    """Stores the value before the txid too, and re-applies a replay over it: for any source."""


class FailureResponse(enum.StrEnum):
    """What the failure sensor of a txid's run did about a failed attempt (the log records it)."""

    REQUEUE = "requeue"
    """Restart the txid's run and the runs of every later txid, in one request: each begin
    re-emits its txid with a new attempt, in order. One request per cascade, not one per run: a
    herd of simultaneous restarts races Airflow's scheduler (it has died of it)."""
    LEAVE_TO_ORIGIN = "leave_to_origin"
    """The txid failed in a cascade from an earlier txid, whose sensor re-queues this run."""
    STOP = "stop"
    """Poison batch: the txid failed on its own ``max_attempts`` times. Its run is not restarted,
    says why, and every later txid waits for it (no silent skip) until a person reruns it."""


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
    response: FailureResponse | None = None
    """Once failed: what the failure sensor decided about it (recorded in a txid's history)."""

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

    # -- derived facts -------------------------------------------------------------------------

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


# -- begin -------------------------------------------------------------------------------------


class BeginAction(enum.StrEnum):
    NEW = "new"
    """First emission of a new txid, attempt 1: initialise its metadata from ``txid - 1``'s."""
    REPLAY = "replay"
    """Re-emission of a failed txid with a new attempt."""
    REEMIT = "reemit"
    """Re-emission of a txid whose processing attempt's lease ran out (its process is gone): the
    attempt is failed first, with the cascade of :func:`plan_failure`."""
    RESUME = "resume"
    """The txid's current attempt is alive (processing under a live lease, or processed): begin
    hands out that same attempt again. A retried or duplicated begin (Airflow may report a
    finished task as lost and run it again) must never re-emit what its first try claimed."""
    ALREADY_COMMITTED = "already_committed"
    """Nothing to do: the txid committed already."""
    WAIT_PREVIOUS = "wait_previous"
    """``txid - 1`` has not (re-)initialised its metadata yet; metadata is initialised in order."""
    WAIT_WINDOW = "wait_window"
    """The txid is beyond the ``max_pending`` window."""
    NOT_REPLAYED = "not_replayed"
    """The txid's current attempt failed and this begin may not replay it (``replay=False``): the
    answer to a failure, replay or stop at a poison batch, belongs to whoever watches failures.
    An Airflow retry of a claim that already failed must not add an attempt behind its back."""


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
        return BeginPlan(
            BeginAction.REPLAY,
            txid,
            attempt=rec.attempt + 1,
            reuse_metadata=reuse,
            prev_metadata=view.metadata_before(txid),
        )
    if not lease_expired(rec, view.now):
        return BeginPlan(BeginAction.RESUME, txid, attempt=rec.attempt, reuse_metadata=True)
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

    Failed txids come first, oldest first (they replay in order); then a new txid if the window has
    room.
    """
    for rec in view.in_flight:
        if rec.status is TxStatus.FAILED:
            return rec.txid
    new = view.next_new_txid
    return new if new in view.window else None


# -- processed ---------------------------------------------------------------------------------


class ProcessedAction(enum.StrEnum):
    ACCEPT = "accept"
    """Record the output and mark the txid processed."""
    DUPLICATE = "duplicate"
    """The same attempt already recorded the same output (a duplicate run): nothing to do."""
    IGNORE_STALE = "ignore_stale"
    """A late report from an attempt that is no longer current: ignored, as in Storm."""


def attempt_is_current(record: TxRecord | None, *, pipeline: str, txid: int, attempt: int) -> bool:
    """Whether ``(txid, attempt)`` may still record processed output.

    False for a stale attempt (replaced, failed, or its txid committed): its reports are ignored, as
    in Storm. Raises :class:`NotBegunError` for a txid or attempt that was never emitted.
    A per-txid rule: it needs only the txid's own record (``None`` if it was never begun), so the
    log can apply it holding that txid's row lock while other txids stage their output in parallel.
    """
    if record is None:
        raise NotBegunError(
            "processing reported for a txid that was never begun",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    if attempt > record.attempt:
        raise NotBegunError(
            f"attempt was never emitted (current attempt is {record.attempt})",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    return attempt == record.attempt and record.status in (TxStatus.PROCESSING, TxStatus.PROCESSED)


def attempt_may_stage(record: TxRecord | None, *, pipeline: str, txid: int, attempt: int) -> bool:
    """Whether ``(txid, attempt)`` may stage (part of) its output now.

    Only while it is current and still processing: once its output is recorded, staging more would
    change what the commit applies behind the recorded counts.
    """
    current = attempt_is_current(record, pipeline=pipeline, txid=txid, attempt=attempt)
    return current and record is not None and record.status is TxStatus.PROCESSING


def plan_processed(
    record: TxRecord | None,
    *,
    pipeline: str,
    txid: int,
    attempt: int,
    output: Mapping[str, Any] | None,
) -> ProcessedAction:
    """Decide what a "processing finished" report of ``(txid, attempt)`` with ``output`` means."""
    if not attempt_is_current(record, pipeline=pipeline, txid=txid, attempt=attempt):
        return ProcessedAction.IGNORE_STALE
    assert record is not None
    if record.status is TxStatus.PROCESSED:
        if dict(record.output or {}) == dict(output or {}):
            return ProcessedAction.DUPLICATE
        raise ConflictingOutputError(
            f"attempt already recorded output {dict(record.output or {})!r}, now reports "
            f"{dict(output or {})!r}",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    return ProcessedAction.ACCEPT


# -- commit ------------------------------------------------------------------------------------


class CommitAction(enum.StrEnum):
    APPLY = "apply"
    """Apply the attempt's output and mark the txid committed, in one database transaction."""
    ALREADY_COMMITTED = "already_committed"
    """Idempotent commit: the txid committed already; nothing is applied twice."""


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


class SinkAction(enum.StrEnum):
    ADD = "add"
    """The lake table does not hold this txid yet: add the attempt's output in one table commit."""
    ALREADY_IN_TABLE = "already_in_table"
    """The table holds this very attempt of the txid (a commit that crashed after the table
    commit, before the log's): complete the log's commit without adding anything twice."""
    REPLACE = "replace"
    """The table holds the txid from another attempt (a commit that failed after this table's
    commit, e.g. at another sink, and replayed): rewind the table to the txid before, then add
    this attempt's output. A table holds, for a txid, the rows of exactly one attempt: the one
    the log commits."""


def plan_sink_commit(
    table_txid: int,
    txid: int,
    *,
    pipeline: str,
    attempt: int,
    sink: str,
    table_attempt: int | None = None,
) -> SinkAction:
    """Whether the commit of ``(txid, attempt)`` adds to a lake table whose newest commit by this
    pipeline recorded ``table_txid`` (0: none), by ``table_attempt`` (``None``: unknown). Commits
    are ordered by the log, so a table ahead of the txid being committed was written by something
    else (another log, a restored table): adding would break exactly-once, so it is refused."""
    if table_txid == txid:
        if table_attempt == attempt:
            return SinkAction.ALREADY_IN_TABLE
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


def attempt_is_dead(rec: TxRecord, attempt: int) -> bool:
    """``attempt`` of the txid can never commit: another attempt replaced it, or it was failed."""
    return attempt != rec.attempt or rec.status is TxStatus.FAILED


def committable(view: PipelineView) -> TxRecord | None:
    """The one transaction that may commit now, if any (oldest uncommitted, processed)."""
    rec = view.record(view.oldest_uncommitted)
    return rec if rec is not None and rec.status is TxStatus.PROCESSED else None


# -- failure and recovery ----------------------------------------------------------------------


LEASE_HOLDER_CHARS = 500
"""A lease holder's name is stored up to this many characters."""


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


# -- liveness: the lease on a processing attempt ----------------------------------------------


def lease_expired(rec: TxRecord, now: datetime | None) -> bool:
    """Whether ``rec``'s processing attempt lost its lease: its process stopped proving it is
    alive (killed, out of memory, a lost worker), so nobody will ever report its outcome.

    Only a ``PROCESSING`` attempt holds a lease: a processed one's output is durable, a failed or
    committed one is done. Judged by the log's clock (``now`` of the view), never a worker's.
    """
    return (
        rec.status is TxStatus.PROCESSING
        and rec.lease_expires_at is not None
        and now is not None
        and now >= rec.lease_expires_at
    )


class LeaseRenewal(enum.StrEnum):
    """What renewing an attempt's lease finds."""

    RENEWED = "renewed"
    """Still processing: the lease was extended."""
    DONE = "done"
    """Its output is recorded (processed, or committed since): nothing left to prove alive, and
    nothing to stop (its process may still be shutting down Spark)."""
    LOST = "lost"
    """Failed or replaced: its work will never count, so its process should stop."""


def lease_renewal(record: TxRecord | None, attempt: int) -> LeaseRenewal:
    """What a renewal of ``attempt``'s lease on ``record`` (its txid, ``None`` if never begun)
    finds. Only a processing attempt holds a lease; one whose output is recorded is done, not lost:
    stopping its process then would fail an attempt that finished."""
    if record is None or record.attempt != attempt or record.status is TxStatus.FAILED:
        return LeaseRenewal.LOST
    if record.status is TxStatus.PROCESSING:
        return LeaseRenewal.RENEWED
    return LeaseRenewal.DONE


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


def validate_max_pending(max_pending: int) -> int:
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
        raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
    return max_pending


# -- retention ---------------------------------------------------------------------------------

DEFAULT_KEEP_TXIDS = 1000
"""Committed txids whose rows (current record and attempt history) the log keeps, by default."""
PRUNE_BATCH = 500
"""At most this many txids are pruned by one call: a commit never stalls on a large backlog
(a log upgraded after a million txids catches up over a few thousand commits)."""
PRUNE_EVERY = 16
"""Pruning waits until this many txids are due: one DELETE per 16 commits, not one per commit."""


def validate_keep_txids(keep_txids: int) -> int:
    if isinstance(keep_txids, bool) or not isinstance(keep_txids, int) or keep_txids < 1:
        raise ValueError(f"keep_txids must be an int >= 1, got {keep_txids!r}")
    return keep_txids


def retention_horizon(last_committed: int, keep_txids: int) -> int:
    """The newest txid retention may prune: every txid up to it is committed and older than the
    newest ``keep_txids`` committed ones (0: none).

    What the rules read is never below it: the last committed txid (its metadata is where the next
    txid's batch starts; ``keep_txids >= 1`` keeps it), the txids in flight (all above it) and a
    failed txid's attempt history (failed txids are in flight). Older txids are committed for good:
    a begin, commit or failure naming one answers from ``last_committed`` alone.
    """
    validate_keep_txids(keep_txids)
    return max(0, last_committed - keep_txids)


def prune_range(
    last_committed: int,
    keep_txids: int,
    pruned_through: int,
    *,
    batch: int = PRUNE_BATCH,
    every: int = 1,
) -> range:
    """Txids whose rows may be deleted now: those after ``pruned_through`` (pruned already) up to
    :func:`retention_horizon`, at most ``batch`` of them, oldest first; none until at least
    ``every`` are due. Idempotent: once pruned, ``pruned_through`` moves and they are not asked
    for again."""
    if batch < 1 or every < 1:
        raise ValueError(f"batch and every must be >= 1, got {batch}, {every}")
    horizon = retention_horizon(last_committed, keep_txids)
    if horizon - pruned_through < every:
        return range(0)
    return range(pruned_through + 1, min(horizon, pruned_through + batch) + 1)


__all__: Sequence[str] = (
    "DEFAULT_KEEP_TXIDS",
    "PRUNE_BATCH",
    "PRUNE_EVERY",
    "BeginAction",
    "BeginPlan",
    "CommitAction",
    "FailureResponse",
    "LeaseRenewal",
    "PipelineView",
    "ProcessedAction",
    "SinkAction",
    "SourceKind",
    "StateKind",
    "TxRecord",
    "TxStatus",
    "attempt_is_current",
    "attempt_is_dead",
    "attempt_may_stage",
    "committable",
    "expired_lease",
    "lease_expired",
    "lease_renewal",
    "next_to_begin",
    "plan_begin",
    "plan_commit",
    "plan_expiry",
    "plan_failure",
    "plan_processed",
    "plan_recovery",
    "plan_sink_commit",
    "prune_range",
    "retention_horizon",
    "validate_keep_txids",
    "validate_max_pending",
)
