"""The log's transitions that hold the pipeline's row lock: begin, commit, fail, recover, expire.

Each is one explicit database transaction: it locks the pipeline's row
(:func:`~airflow_txn_provider.log.rows.lock_pipeline`, the lock retention and the declaration take
too), reads a :class:`~airflow_txn_provider.rules.records.PipelineView`, asks the pure coordinator
(:mod:`airflow_txn_provider.rules.coordinator`), and writes its answer through the txid rows' one
writer (:class:`~airflow_txn_provider.log.rows.TxidRows`). The lock makes "one commit at a time per
pipeline" and "metadata initialised in txid order" hold in Postgres, whoever calls (Airflow may run
the same task twice, #23520). :class:`PipelineTransitions` is a part of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, update

from airflow_txn_provider.log.fill_progress import fill_floor
from airflow_txn_provider.log.models import PIPELINES
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import TxidRows, load_view
from airflow_txn_provider.rules.config import CLAIM_TIMEOUT, PRUNE_EVERY
from airflow_txn_provider.rules.coordinator import (
    BeginPlan,
    next_to_begin,
    plan_begin,
    plan_commit,
    plan_expiry,
    plan_failure,
    plan_recovery,
)
from airflow_txn_provider.rules.exceptions import (
    ExpectationsFailedError,
    LeaseExpiredError,
    PipelineConfigError,
    SourceError,
    TxnError,
)
from airflow_txn_provider.rules.fencing import claim_timeout_for
from airflow_txn_provider.rules.history import prune_range
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.sources import Source, validate_metadata
from airflow_txn_provider.rules.vocabulary import BeginAction, CommitAction, TxStatus
from airflow_txn_provider.sources.catalog import with_log_catalog
from airflow_txn_provider.transactions.retention import prune_locked
from airflow_txn_provider.utils import metrics
from airflow_txn_provider.utils.retries import is_transient, retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)

ApplyFn = Callable[["Connection", TxRecord], "Mapping[str, Any] | None"]


@dataclass(frozen=True)
class Emission:
    """What ``begin`` did: emitted an attempt of the txid, or why it did not."""

    pipeline: str
    txid: int
    action: BeginAction
    attempt: int | None = None
    metadata: Any = None
    no_data: bool = False
    """The source has no new data for this txid yet; nothing was allocated."""
    invalidated: tuple[int, ...] = ()
    """Txids whose live attempts were failed to re-emit this one (``REEMIT`` only)."""

    @property
    def resumed(self) -> bool:
        """The txid's current, live attempt was handed out again (nothing new emitted)."""
        return self.action is BeginAction.RESUME

    @property
    def emitted(self) -> bool:
        return self.attempt is not None and not self.no_data


@dataclass(frozen=True)
class CommitResult:
    pipeline: str
    txid: int
    attempt: int
    applied: bool
    """False when the txid had committed already (an idempotent no-op)."""
    committed_attempt: int
    details: Mapping[str, Any] | None = None


class PipelineTransitions(LogPart):
    """The transitions under the pipeline's row lock."""

    # -- begin -----------------------------------------------------------------------------------

    @retry_transient
    def begin(
        self,
        pipeline: str,
        txid: int,
        source: Source,
        *,
        claim_timeout: float = CLAIM_TIMEOUT,
        replay: bool = True,
    ) -> Emission:
        """Emit ``txid``: allocate it (or re-emit it with a new attempt) and fix its metadata.

        If the txid's current attempt is alive (processing under a live lease, or processed), that
        attempt is handed out again (``RESUME``): a begin that is retried, or run twice, never
        re-emits what it claimed. The emitted (or resumed) attempt's lease lasts
        ``claim_timeout`` seconds, for its processing to start and renew it.

        Never raises for "not yet": an :class:`Emission` that did not emit says why (the previous
        txid has not begun, the window is full, the source has no data, the txid committed, or
        the txid failed and ``replay`` is false).
        """
        source = with_log_catalog(source, self.engine)
        _prefetch(source)
        with self.engine.begin() as conn:
            view = load_view(conn, pipeline, lock=True)
            self._check_source(view, source)
            emission = self._begin_locked(conn, view, txid, source, claim_timeout, replay=replay)
        return _counted(emission)

    @retry_transient
    def begin_next(self, pipeline: str, source: Source) -> Emission | None:
        """Emit whatever txid should go next (oldest failed first, else a new one); ``None`` if the
        window is full."""
        source = with_log_catalog(source, self.engine)
        _prefetch(source)
        with self.engine.begin() as conn:
            view = load_view(conn, pipeline, lock=True)
            self._check_source(view, source)
            txid = next_to_begin(view)
            if txid is None:
                return None
            emission = self._begin_locked(conn, view, txid, source, CLAIM_TIMEOUT)
        return _counted(emission)

    def _begin_locked(
        self,
        conn: Connection,
        view: PipelineView,
        txid: int,
        source: Source,
        claim_timeout: float,
        *,
        replay: bool = True,
    ) -> Emission:
        plan = plan_begin(view, txid, replay=replay)
        if plan.action is BeginAction.REEMIT:
            # The view read the txid without its row lock: a staging (which holds only that lock
            # for as long as its COPY runs, blocking renewals) may be about to record the output.
            # Wait for the row, then plan again by what it holds (as expire_lease does).
            TxidRows(conn, view.pipeline, txid).locked_record()
            view = load_view(conn, view.pipeline, lock=False)
            plan = plan_begin(view, txid, replay=replay)
        if plan.action is BeginAction.RESUME:
            rec = view.record(txid)
            assert rec is not None
            if rec.status is TxStatus.PROCESSING:  # give its processing time to (re)start
                claim = func.now() + timedelta(seconds=claim_timeout)
                TxidRows(conn, view.pipeline, txid).extend_claim(claim)
            log.info(
                "pipeline=%s txid=%s attempt=%s resumed (%s): it is alive, not re-emitted",
                view.pipeline,
                txid,
                rec.attempt,
                rec.status.value,
            )
            return Emission(
                view.pipeline, txid, plan.action, attempt=rec.attempt, metadata=rec.metadata
            )
        if not plan.emits:
            return Emission(view.pipeline, txid, plan.action)
        assert plan.attempt is not None
        if plan.invalidate:
            self._fail_locked(
                conn,
                view,
                plan.invalidate,
                origin=txid,
                error=f"txid {txid} re-emitted with attempt {plan.attempt}",
            )
        metadata = self._metadata_for(view, plan, source)
        if metadata is None:
            return Emission(view.pipeline, txid, plan.action, no_data=True)
        claim = func.now() + timedelta(seconds=claim_timeout_for(view.record(txid), claim_timeout))
        TxidRows(conn, view.pipeline, txid).emit(
            plan.attempt, metadata, claim, new=plan.action is BeginAction.NEW
        )
        log.info(
            "pipeline=%s txid=%s attempt=%s emitted (%s)",
            view.pipeline,
            txid,
            plan.attempt,
            plan.action.value,
        )
        return Emission(
            view.pipeline,
            txid,
            plan.action,
            attempt=plan.attempt,
            metadata=metadata,
            invalidated=plan.invalidate,
        )

    @staticmethod
    def _metadata_for(view: PipelineView, plan: BeginPlan, source: Source) -> Any:
        asked = "initialize_transaction"
        try:
            if plan.reuse_metadata:
                asked = "replay_metadata"
                rec = view.record(plan.txid)
                assert rec is not None
                if rec.metadata is None:
                    return None
                metadata = source.replay_metadata(plan.txid, rec.metadata, plan.prev_metadata)
                if metadata is rec.metadata:
                    return metadata  # the stored batch, as stored
            else:
                metadata = source.initialize_transaction(plan.txid, plan.prev_metadata)
        except TxnError as err:
            if err.pipeline is not None:
                raise
            raise err.naming(view.pipeline, plan.txid, plan.attempt) from err
        except Exception as err:
            raise SourceError(
                f"{type(source).__name__}.{asked} failed: {err}",
                pipeline=view.pipeline,
                txid=plan.txid,
                attempt=plan.attempt,
            ) from err
        if metadata is None:
            return None
        return validate_metadata(
            metadata, pipeline=view.pipeline, txid=plan.txid, attempt=plan.attempt
        )

    @staticmethod
    def _check_source(view: PipelineView, source: Source) -> None:
        if source.kind is not view.source_kind:
            raise PipelineConfigError(
                f"pipeline has a {view.source_kind.value} source, got {type(source).__name__} "
                f"({source.kind.value})",
                pipeline=view.pipeline,
            )

    # -- commit ----------------------------------------------------------------------------------

    @retry_transient
    def commit(
        self, pipeline: str, txid: int, attempt: int, apply: ApplyFn | None = None
    ) -> CommitResult:
        """Commit ``(txid, attempt)``: run ``apply`` and mark the txid committed, atomically.

        Refused (typed error, nothing written) if the attempt is stale, not processed, or
        ``txid - 1`` has not committed. Committing a committed txid is a no-op. If ``apply``
        raises, nothing of it is kept, the txid is failed (with the cascade: it replays whole, as
        Storm replays a transaction whose commit failed) and the error is raised.
        """
        started = time.monotonic()
        try:
            with self.engine.begin() as conn:
                view = load_view(conn, pipeline, lock=True)
                action = plan_commit(view, txid, attempt)
                if action is CommitAction.ALREADY_COMMITTED:
                    # 0 once retention pruned the txid's record: committed, attempt forgotten.
                    committed_attempt = TxidRows(conn, pipeline, txid).current_attempt() or 0
                    log.info(
                        "pipeline=%s txid=%s attempt=%s already committed (attempt %s): no-op",
                        pipeline,
                        txid,
                        attempt,
                        committed_attempt,
                    )
                    return CommitResult(pipeline, txid, attempt, False, committed_attempt)
                record = view.record(txid)
                assert record is not None
                details = None
                if apply is not None:
                    try:
                        details = apply(conn, record)
                    except Exception as err:
                        if is_transient(err):  # the database went away: retry, don't fail
                            raise
                        raise _ApplyFailed() from err
                rows = TxidRows(conn, pipeline, txid)
                rows.move(attempt, TxStatus.COMMITTED)
                rows.add_timings(attempt, {"commit": time.monotonic() - started})  # lock + apply
                kept = conn.execute(
                    update(PIPELINES)
                    .where(PIPELINES.c.name == pipeline)
                    .values(last_committed_txid=txid, updated_at=func.now())
                    .returning(PIPELINES.c.keep_txids, PIPELINES.c.pruned_through_txid)
                ).one()
                # Retention, under the lock this commit holds: a bounded batch, now and then.
                due = prune_range(
                    txid,
                    kept.keep_txids,
                    kept.pruned_through_txid,
                    every=PRUNE_EVERY,
                    keep_from=fill_floor(conn, pipeline),
                )
                if due:
                    prune_locked(conn, pipeline, due)
        except _ApplyFailed as failed:
            error = failed.__cause__
            audit = error.outcomes if isinstance(error, ExpectationsFailedError) else None
            self.fail(pipeline, txid, attempt, error=f"commit failed: {error}", expectations=audit)
            assert error is not None
            raise error from None
        log.info("pipeline=%s txid=%s attempt=%s committed", pipeline, txid, attempt)
        return CommitResult(pipeline, txid, attempt, True, attempt, details)

    # -- failure ---------------------------------------------------------------------------------

    @retry_transient
    def fail(
        self,
        pipeline: str,
        txid: int,
        attempt: int | None = None,
        *,
        error: str | None = None,
        of_processing: bool = False,
        holder: str | None = None,
        expectations: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[int, ...]:
        """Fail ``(txid, attempt)`` and every later txid in flight; return the txids failed.

        A report from an attempt that is no longer current fails nothing. ``of_processing``: the
        report is a processing task's or job's; an attempt whose output is recorded already is
        kept (it commits), since the failure came after its work was done. ``holder``: the
        reporting process's lease holder name; a report from a process whose lease another took
        over fails nothing (:func:`~airflow_txn_provider.rules.coordinator.plan_failure`).
        ``expectations``: the outcomes of the commit's audit that failed it, recorded with it.
        """
        with self.engine.begin() as conn:
            view = load_view(conn, pipeline, lock=True)
            txids = plan_failure(view, txid, attempt, of_processing=of_processing, reporter=holder)
            self._fail_locked(conn, view, txids, origin=txid, error=error or "failed")
            if txid in txids and expectations is not None and attempt is not None:
                TxidRows(conn, pipeline, txid).record_expectations(attempt, expectations)
        if txids:
            log.warning(
                "pipeline=%s txid=%s attempt=%s failed; re-queued txids %s: %s",
                pipeline,
                txid,
                attempt,
                list(txids),
                error,
            )
        return txids

    @retry_transient
    def recover(self, pipeline: str) -> tuple[int, ...]:
        """After everything stopped: fail attempts that were processing (their processes are gone)
        and every later txid, so they re-emit in order. Processed txids before them keep their
        output. Returns the txids failed."""
        with self.engine.begin() as conn:
            view = load_view(conn, pipeline, lock=True)
            txids = plan_recovery(view)
            self._fail_locked(
                conn, view, txids, origin=txids[0] if txids else 0, error="recovered after restart"
            )
        if txids:
            log.warning("pipeline=%s recovery re-queued txids %s", pipeline, list(txids))
        return txids

    def _fail_locked(
        self,
        conn: Connection,
        view: PipelineView,
        txids: Sequence[int],
        *,
        origin: int,
        error: str,
    ) -> None:
        for txid in txids:
            rec = view.record(txid)
            assert rec is not None
            message = error if txid == origin else f"failed with txid {origin}: {error}"
            TxidRows(conn, view.pipeline, txid).move(
                rec.attempt, TxStatus.FAILED, error=message, failed_by=origin
            )

    # -- liveness --------------------------------------------------------------------------------

    @retry_transient
    def expire_lease(self, pipeline: str, txid: int, attempt: int) -> tuple[int, ...]:
        """Fail ``(txid, attempt)`` and every later txid in flight if its lease ran out (by the
        database's clock); return the txids failed. Fails nothing while the lease is alive or
        once the attempt is no longer current, so a watcher may call it as often as it likes."""
        with self.engine.begin() as conn:
            view = load_view(conn, pipeline, lock=True)
            txids = plan_expiry(view, txid, attempt)
            if txids:
                # The view read the txid without its row lock: a staging (which holds only that
                # lock, for as long as its COPY runs and blocks renewals meanwhile) may be about
                # to record the output. Wait for the row, then judge again by what it holds.
                TxidRows(conn, pipeline, txid).locked_record()
                view = load_view(conn, pipeline, lock=False)
                txids = plan_expiry(view, txid, attempt)
            if txids:
                rec = view.record(txid)
                assert rec is not None and rec.lease_expires_at is not None
                error = LeaseExpiredError(
                    f"lease expired at {rec.lease_expires_at:%Y-%m-%d %H:%M:%S%z}: "
                    f"{rec.lease_holder or 'its processing task (it never started)'} stopped "
                    "renewing it, so its process is gone (killed, out of memory, a lost worker)",
                    pipeline=pipeline,
                    txid=txid,
                    attempt=attempt,
                )
                self._fail_locked(conn, view, txids, origin=txid, error=str(error))
        if txids:
            log.warning(
                "pipeline=%s txid=%s attempt=%s lease expired; failed txids %s",
                pipeline,
                txid,
                attempt,
                list(txids),
            )
            metrics.incr(metrics.LEASE_EXPIRIES, pipeline)
        return txids


class _ApplyFailed(Exception):
    """Internal: marks an exception raised by the caller's ``apply`` (see ``commit``)."""


def _prefetch(source: Source) -> None:
    """Let the source read what it can before the pipeline's lock is taken (see
    :meth:`Source.prefetch`); its errors are raised, naming the txid, under the lock."""
    try:
        source.prefetch()
    except Exception as err:
        log.debug("%s.prefetch failed (retried under the lock): %s", type(source).__name__, err)


def _counted(emission: Emission) -> Emission:
    """``emission``, a replay counted in the metrics once its begin committed."""
    if emission.emitted and emission.action in (BeginAction.REPLAY, BeginAction.REEMIT):
        metrics.incr(metrics.REEMISSIONS, emission.pipeline)
    return emission
