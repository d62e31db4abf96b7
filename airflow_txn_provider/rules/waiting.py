"""The Airflow side's waiting policy: what the deferred tasks and the failure sensor watch the
log for, the event a trigger wakes a task with (:class:`TxnEvent`), and how the sensor answers a
failure. Pure, like the rules it reads (:mod:`airflow_txn_provider.rules.coordinator`), which decide
every transition; this module only says when a task may stop waiting and what it does next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.rules.config import RUN_LEAD, RUNS_AHEAD
from airflow_txn_provider.rules.coordinator import (
    committable,
    next_to_begin,
    plan_begin,
    plan_commit,
)
from airflow_txn_provider.rules.exceptions import (
    MalformedEventError,
    NotBegunError,
    NotProcessedError,
    OutOfOrderCommitError,
    StaleAttemptError,
)
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import (
    BeginAction,
    CommitAction,
    EventState,
    FailureResponse,
    TxStatus,
)

# -- waiting (what the Airflow triggers watch for) ---------------------------------------------


class GateState(StrEnum):
    OPEN = "open"
    """``txid - 1`` has committed: ``(txid, attempt)`` may commit now (if processed)."""
    WAIT = "wait"
    """``txid - 1`` has not committed yet."""
    COMMITTED = "committed"
    """The txid itself committed already (a duplicate run): nothing left to do."""
    STALE = "stale"
    """The attempt was failed or replaced: it must not commit; its run restarts."""
    UNFINISHED = "unfinished"
    """The attempt is still processing although the gate's tasks upstream have ended: they stopped
    without recording its output. Its lease or failure callback fails it, and its run restarts."""


ATTEMPT_NEEDED = frozenset({EventState.LEASE_EXPIRED, EventState.ALERT})
"""Events whose attempt the woken task acts on (the sensor expires that very attempt's lease;
after an alert it watches that attempt again)."""


@dataclass(frozen=True)
class TxnEvent:
    """The event a trigger wakes its task with: what happened, to which txid and attempt.

    Airflow stores its payload (:meth:`to_payload`: a JSON-able dict, ``state`` then ``attempt``
    and ``txid`` where set) and hands it to the resumed task, which reads it back with
    :meth:`from_payload`. Only a ``MANUAL_RUN`` event has no txid (its trigger knows none).
    """

    state: EventState
    attempt: int | None = None
    txid: int | None = None

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"state": self.state.value}
        if self.attempt is not None:
            payload["attempt"] = self.attempt
        if self.txid is not None:
            payload["txid"] = self.txid
        return payload

    @classmethod
    def from_payload(cls, payload: Any, *, pipeline: str | None = None) -> TxnEvent:
        """The event ``payload`` holds; :class:`MalformedEventError` (naming ``pipeline`` and
        the payload's txid) if its state is unknown, its txid is missing or not an integer, or
        its attempt is not an integer or missing where the task acts on it. Other keys are
        ignored."""
        if not isinstance(payload, Mapping):
            raise MalformedEventError(
                f"trigger event {payload!r} is not a mapping", pipeline=pipeline
            )
        state, txid, attempt = payload.get("state"), payload.get("txid"), payload.get("attempt")

        def malformed(problem: str) -> MalformedEventError:
            return MalformedEventError(
                f"trigger event {dict(payload)!r}: {problem}",
                pipeline=pipeline,
                txid=txid if _is_int(txid) else None,
                attempt=attempt if _is_int(attempt) else None,
            )

        if not isinstance(state, str) or state not in {s.value for s in EventState}:
            raise malformed(f"unknown state {state!r}")
        kind = EventState(state)
        if txid is None and kind is not EventState.MANUAL_RUN:
            raise malformed("no txid")
        if txid is not None and not _is_int(txid):
            raise malformed(f"txid {txid!r} is not an integer")
        if attempt is None and kind in ATTEMPT_NEEDED:
            raise malformed(f"a {state} event names no attempt")
        if attempt is not None and not _is_int(attempt):
            raise malformed(f"attempt {attempt!r} is not an integer")
        return cls(kind, attempt, txid)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def commit_gate(view: PipelineView, txid: int, attempt: int) -> GateState:
    """Whether the commit of ``(txid, attempt)`` may proceed, must wait, or never will: the
    commit rule's answer (:func:`~airflow_txn_provider.rules.coordinator.plan_commit`), read as a
    gate.

    Asked once the processing tasks ended, whether or not Airflow saw them succeed: the log, not a
    task's state, says whether the output was recorded (a task may record it, then fail to report
    success to an api-server that is away).
    """
    try:
        action = plan_commit(view, txid, attempt)
    except (NotBegunError, StaleAttemptError):
        return GateState.STALE
    except NotProcessedError:  # current and alive, so still processing
        return GateState.UNFINISHED
    except OutOfOrderCommitError:
        return GateState.WAIT
    return GateState.COMMITTED if action is CommitAction.ALREADY_COMMITTED else GateState.OPEN


def may_begin_now(view: PipelineView, txid: int) -> bool:
    """Whether beginning ``txid`` would do something other than wait (for ``txid - 1`` to be
    (re-)initialised, or for the window to move)."""
    return plan_begin(view, txid).action not in (BeginAction.WAIT_PREVIOUS, BeginAction.WAIT_WINDOW)


def new_txid_due(view: PipelineView | None) -> int | None:
    """The new txid whose DAG run the waker creates once its source has data for it, or
    ``None`` (``view`` ``None``: the pipeline is not in the log yet, so txid 1).

    Only the txid the coordinator would begin next (:func:`~airflow_txn_provider.rules.coordinator.
    next_to_begin`), and only when that is a new one: a failed txid already has its run (its
    failure sensor restarts it), and a txid beyond the window would only wait in its run. So an
    idle pipeline holds no run at all, and a run exists only for work that can start now.
    """
    if view is None:
        return 1
    txid = next_to_begin(view)
    return txid if txid == view.next_new_txid else None


def runs_ahead(view: PipelineView) -> range:
    """The new txids just past the window (:data:`~airflow_txn_provider.rules.config.RUNS_AHEAD`
    of them) whose DAG runs a claim may create ahead of time; empty while a failed txid is in
    flight: that one replays first, in its own run.

    Their claims wait in their workers, each for the begin before it, then for the window to
    move, and the next begins the moment the oldest txid commits, instead of the commit freeing a
    slot, then the waker's poll, the run's creation, its scheduling and its task's start, one
    after the other, each txid.
    """
    if any(rec.status is TxStatus.FAILED for rec in view.in_flight):
        return range(0)
    return range(view.window.stop, view.window.stop + RUNS_AHEAD)


def begin_spacing(view: PipelineView) -> float | None:
    """Seconds between the begins of the txids in flight, on average (how often a txid begins
    in steady state: each begins as one commits); ``None`` with fewer than two begun ones."""
    begun = sorted(r.begun_at for r in view.in_flight if r.begun_at is not None)
    if len(begun) < 2:
        return None
    return (begun[-1] - begun[0]).total_seconds() / (len(begun) - 1)


def runs_ahead_wanted(view: PipelineView) -> int:
    """How many runs past the window a claim makes (:func:`runs_to_make`): as many txids as begin
    in :data:`~airflow_txn_provider.rules.config.RUN_LEAD` seconds at the pace of those in flight,
    from 1 to :data:`~airflow_txn_provider.rules.config.RUNS_AHEAD` (all of them while that pace
    is unknown or the window filled at once). A run made ahead waits in its worker until its
    txid may begin: more than the lead needs would only wait longer."""
    spacing = begin_spacing(view)
    if spacing is None or spacing <= 0:
        return RUNS_AHEAD
    return max(1, min(RUNS_AHEAD, math.ceil(RUN_LEAD / spacing)))


def runs_to_make(view: PipelineView) -> range:
    """The new txids whose DAG runs a claim makes now, oldest first, each only if its source has
    data for it (the first without data ends them): every new txid the window admits and those
    just past it (the first :func:`runs_ahead_wanted` of :func:`runs_ahead`: the caller makes
    those only while its log has wait slots for their claims), above the newest whose run was made
    already (``view.runs_made_through``).
    None while a failed txid is in flight: that one replays first, in its own run.

    So a backlog's window fills at once, and keeps filling as it moves, scheduling rounds ahead
    of the begins, instead of one run per claim, each made by the claim before it. A run made
    before its ``txid - 1`` began waits in its worker for that begin (a moment: their runs were
    made together, or that one's claim waits for the window too)."""
    ahead = runs_ahead(view)
    if not ahead:
        return range(0)
    stop = ahead.start + runs_ahead_wanted(view)
    return range(max(view.next_new_txid, view.runs_made_through + 1), stop)


def previous_unbegun(view: PipelineView, txid: int) -> bool:
    """Whether ``txid - 1`` has never begun: ``txid``'s run was made ahead with it
    (:func:`runs_to_make`), and its claim waits a moment for that first begin, not for a replay."""
    return txid - 1 >= view.next_new_txid


@dataclass(frozen=True)
class TxidChange:
    """A write of one txid's row as the log notifies it (:mod:`airflow_txn_provider.log.changes`):
    the txid and the status it reached. A task waiting in its worker reads the log again only for
    a change that can end its wait (the functions below), not at every write of its pipeline."""

    txid: int
    status: TxStatus


def may_end_ahead_wait(change: TxidChange, txid: int, max_pending: int) -> bool:
    """Whether ``change`` can end the wait of run-ahead ``txid`` (:func:`runs_ahead`) for a
    window of ``max_pending``: the begin of ``txid - 1``, a commit that brings the window up to
    it (commits are in order: ``c`` committed opens ``[c + 1, c + 1 + max_pending)``), or a
    failure, which takes it out of the runs ahead."""
    if change.status is TxStatus.FAILED:
        return True
    if change.status is TxStatus.COMMITTED:
        return change.txid >= txid - max_pending
    return change.status is TxStatus.PROCESSING and change.txid == txid - 1


def may_end_previous_wait(change: TxidChange, txid: int) -> bool:
    """Whether ``change`` can end the wait of ``txid`` for the first begin of ``txid - 1``
    (:func:`previous_unbegun`): a change of that txid, or one that may make ``txid`` a run ahead
    (a commit moves the window, a replay's begin ends a failure) or none (a failure); only
    another txid's processed output cannot."""
    return change.txid == txid - 1 or change.status is not TxStatus.PROCESSED


def may_end_turn_wait(change: TxidChange, txid: int) -> bool:
    """Whether ``change`` can end the wait of processed ``txid`` for its turn to commit
    (:func:`awaits_its_turn`): a txid up to it processed (the ones before may then commit),
    committed or failed; a begin (only later txids begin meanwhile) cannot."""
    return change.txid <= txid and change.status is not TxStatus.PROCESSING


def awaits_its_turn(view: PipelineView, txid: int) -> bool:
    """Whether processed ``txid`` waits only for the txids before it, each still processing or
    processed (none failed): its processing task may wait for its commit in its worker."""
    rec = view.record(txid)
    if rec is None or rec.status is not TxStatus.PROCESSED:
        return False
    before = [r for r in view.in_flight if r.txid < txid]
    return all(r.status in (TxStatus.PROCESSING, TxStatus.PROCESSED) for r in before)


def blocked_by(view: PipelineView, txid: int) -> TxRecord | None:
    """The failed txid that holds ``txid`` back (the oldest failed one before it), if any:
    metadata is (re-)initialised in order, so nothing after it can begin until it does."""
    for rec in view.in_flight:
        if rec.txid >= txid:
            break
        if rec.status is TxStatus.FAILED:
            return rec
    return None


def txid_outcome(view: PipelineView, txid: int) -> TxStatus | None:
    """``COMMITTED`` or ``FAILED`` once the txid's current attempt reached either; else ``None``
    (not begun yet, processing, or processed and waiting to commit)."""
    if txid <= view.last_committed:
        return TxStatus.COMMITTED
    rec = view.record(txid)
    if rec is not None and rec.status is TxStatus.FAILED:
        return TxStatus.FAILED
    return None


def awaits_commit(view: PipelineView, txid: int) -> bool:
    """Whether ``txid`` is the one txid that may commit now (the coordinator's
    :func:`~airflow_txn_provider.rules.coordinator.committable`) and has not. Held for long, nobody
    else is about to commit it (the task that recorded the output, or an earlier txid's commit,
    commits what is ready at once)."""
    rec = committable(view)
    return rec is not None and rec.txid == txid


def should_retry(failed_attempts: int, max_attempts: int) -> bool:
    """Poison-batch policy: replay a failed txid until it has failed ``max_attempts`` times, then
    stop the pipeline at it (no silent skip: later txids wait for it)."""
    return failed_attempts < max_attempts


# -- the failure sensor ------------------------------------------------------------------------


def first_watched_attempt(view: PipelineView, txid: int) -> int:
    """The attempt after which a failure sensor that starts with its run watches ``txid``.

    It starts beside the claim: the txid's current attempt, if any, is that run's, even failed
    already (a claim that failed at once, before the sensor started), so its failure counts.
    """
    rec = view.record(txid)
    return rec.attempt - 1 if rec is not None else 0


def known_failed_attempt(view: PipelineView, txid: int) -> int:
    """The newest attempt of ``txid`` whose failure is already known when a watch (re)starts
    without a claim of its own (e.g. the txid was re-begun by a manual clear meanwhile).

    An attempt already failed must not be counted again: begin re-emits the txid anyway. A live
    attempt's failure is still to come, so it counts.
    """
    rec = view.record(txid)
    if rec is None:
        return 0
    return rec.attempt if rec.status is TxStatus.FAILED else rec.attempt - 1


def own_failures(history: Sequence[TxRecord]) -> int:
    """How many failures of a txid count toward ``max_attempts``: its attempts (``history``,
    oldest first) that failed on their own since the pipeline last stopped at it. A person's rerun
    of a poison batch starts a new count; a cascade from an earlier txid never counts.

    Counted from the log, not carried by a sensor: an Airflow retry of the sensor must not reset it.
    """
    count = 0
    for rec in history:
        if rec.response is FailureResponse.STOP:
            count = 0
        elif rec.failed_on_its_own:
            count += 1
    return count


def respond_to_failure(history: Sequence[TxRecord], max_attempts: int) -> FailureResponse:
    """What the failure sensor of a txid's run does now that its newest attempt (``history[-1]``)
    failed: the response recorded already, if an earlier try of the sensor decided; else by the
    txid's own failures so far (see :func:`own_failures`) and ``max_attempts``, the pipeline's
    poison-batch limit. An attempt a ``fail`` expectation failed stops at once: a replay stages
    the same rows.

    A cascade from an earlier txid never counts: that txid's own budget decides, and its sensor
    re-queues the whole cascade.
    """
    if not history:
        raise ValueError("no attempt to respond to")
    rec = history[-1]
    if rec.status is not TxStatus.FAILED:
        raise ValueError(f"txid {rec.txid} attempt {rec.attempt} has not failed")
    if rec.response is not None:
        return rec.response
    if not rec.failed_on_its_own:
        return FailureResponse.LEAVE_TO_ORIGIN
    if rec.failed_expectation:  # its rows would fail again: a poison batch at once
        return FailureResponse.STOP
    return (
        FailureResponse.REQUEUE
        if should_retry(own_failures(history), max_attempts)
        else FailureResponse.STOP
    )


def awaits_requeue(view: PipelineView, txid: int, attempt: int) -> bool:
    """Whether failed ``(txid, attempt)`` could replay now but has not: nothing holds it back
    (``txid - 1`` is not failed), so only a restart of its run is missing. A watch that sees this
    for long restarts the run itself: the origin's re-queue was lost (a crashed sensor, an
    api-server that never came back in time)."""
    rec = view.record(txid)
    if rec is None or rec.status is not TxStatus.FAILED or rec.attempt != attempt:
        return False
    return plan_begin(view, txid).action is BeginAction.REPLAY


def requeue_set(view: PipelineView, failed_txid: int) -> tuple[int, ...]:
    """Txids a failure of ``failed_txid`` re-queues: it and every later txid in flight, whose
    attempts the log failed with it (each one's sensor restarts its own run)."""
    return tuple(
        r.txid
        for r in view.in_flight
        if r.txid >= failed_txid
        and r.status is TxStatus.FAILED
        and (r.failed_by == failed_txid or r.txid == failed_txid)
    )
