"""The attempt fence, pure: whether ``(txid, attempt)`` still counts, judged by its txid's record.

Each (re-)emission of a txid gets a new attempt, and every older attempt is fenced off: its
reports are ignored, it may stage nothing, its lease is lost. These rules need only the txid's
own record (``None`` if it was never begun), never the whole pipeline, so the log applies them
holding that txid's row lock alone, while other txids stage their output in parallel. The rules
that read the whole pipeline are in :mod:`airflow_txn_provider.rules.coordinator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from airflow_txn_provider.rules.exceptions import ConflictingOutputError, NotBegunError
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import LeaseRenewal, ProcessedAction, TxStatus

# -- processed ---------------------------------------------------------------------------------


def attempt_is_current(
    record: TxRecord | None, *, pipeline: str, txid: int, attempt: int, pruned: bool = False
) -> bool:
    """Whether ``(txid, attempt)`` may still record processed output.

    False for a stale attempt (replaced, failed, or its txid committed, ``pruned`` by retention
    since): its reports are ignored, as in Storm. Raises :class:`NotBegunError` for a txid or
    attempt that was never emitted. A per-txid rule: it needs only the txid's own record (``None``
    if it was never begun, or pruned), so the log can apply it holding that txid's row lock while
    other txids stage their output in parallel.
    """
    if record is None and pruned:
        return False  # a late report of a txid committed and pruned since: stale, not unknown
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


def attempt_may_stage(
    record: TxRecord | None, *, pipeline: str, txid: int, attempt: int, pruned: bool = False
) -> bool:
    """Whether ``(txid, attempt)`` may stage (part of) its output now.

    Only while it is current and still processing: once its output is recorded, staging more would
    change what the commit applies behind the recorded counts.
    """
    current = attempt_is_current(
        record, pipeline=pipeline, txid=txid, attempt=attempt, pruned=pruned
    )
    return current and record is not None and record.status is TxStatus.PROCESSING


def plan_processed(
    record: TxRecord | None,
    *,
    pipeline: str,
    txid: int,
    attempt: int,
    output: Mapping[str, Any] | None,
    pruned: bool = False,
) -> ProcessedAction:
    """Decide what a "processing finished" report of ``(txid, attempt)`` with ``output`` means
    (``pruned``: the txid has no record because retention pruned it)."""
    if not attempt_is_current(record, pipeline=pipeline, txid=txid, attempt=attempt, pruned=pruned):
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


def attempt_is_dead(rec: TxRecord, attempt: int) -> bool:
    """``attempt`` of the txid can never commit: another attempt replaced it, or it was failed."""
    return attempt != rec.attempt or rec.status is TxStatus.FAILED


# -- liveness: the lease on a processing attempt -----------------------------------------------


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


CLAIM_BACKOFF_LIMIT = 8.0
"""A re-emitted attempt's claim lasts at most this many times the caller's claim."""


def claim_timeout_for(previous: TxRecord | None, claim_timeout: float) -> float:
    """Seconds the claim of a txid's next attempt lasts (the lease until its processing starts
    renewing it), ``previous`` being the txid's current record (``None`` for a new txid).

    ``claim_timeout``, doubled after an attempt that failed on its own without its processing ever
    renewing the lease (it never started within its claim: a machine or a task queue too busy),
    up to :data:`CLAIM_BACKOFF_LIMIT` times. Without the backoff, each replay on an overloaded
    deployment expires the same way, fails every later txid and adds the load that expired it: a
    storm of replays in which nothing commits. The price is only that a process killed before it
    started is noticed later.
    """
    if (
        previous is None
        or not previous.failed_on_its_own
        or previous.lease_holder is not None
        or previous.begun_at is None
        or previous.lease_expires_at is None
    ):
        return claim_timeout
    claimed = (previous.lease_expires_at - previous.begun_at).total_seconds()
    return min(max(claim_timeout, 2 * claimed), CLAIM_BACKOFF_LIMIT * claim_timeout)


def lease_renewal(record: TxRecord | None, attempt: int) -> LeaseRenewal:
    """What a renewal of ``attempt``'s lease on ``record`` (its txid, ``None`` if never begun)
    finds. Only a processing attempt holds a lease; one whose output is recorded is done, not lost:
    stopping its process then would fail an attempt that finished."""
    if record is None or record.attempt != attempt or record.status is TxStatus.FAILED:
        return LeaseRenewal.LOST
    if record.status is TxStatus.PROCESSING:
        return LeaseRenewal.RENEWED
    return LeaseRenewal.DONE
