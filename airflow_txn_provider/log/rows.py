"""The transaction log's rows: a txid's two rows written together, a pipeline read as one view.

A txid has two rows: its current attempt in ``txn_transaction`` and one row per attempt in
``txn_attempt`` (:mod:`airflow_txn_provider.log.models`). :class:`TxidRows` is their one writer
(every insert, update and retention's delete), so the two never disagree about an attempt's status,
output or error. :func:`load_view` reads a pipeline as the pure coordinator sees it
(:class:`~airflow_txn_provider.rules.records.PipelineView`). Every function runs in the caller's
database transaction; the locking is the caller's (the transitions of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import cast as sa_cast
from sqlalchemy import func, insert, literal, select, text, update
from sqlalchemy.dialects.postgresql import JSONB

from airflow_txn_provider.log.changes import notify_changed, notify_rewound
from airflow_txn_provider.log.models import ATTEMPTS, PIPELINES, TRANSACTIONS
from airflow_txn_provider.rules.config import LEASE_HOLDER_CHARS
from airflow_txn_provider.rules.exceptions import CorruptLogError, UnknownPipelineError
from airflow_txn_provider.rules.history import REWOUND_BY
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import FailureResponse, TxStatus
from airflow_txn_provider.utils.redaction import redact_optional

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement
    from sqlalchemy.engine import Connection, Row

_UNSET: Any = object()

_REACHED_AT: Mapping[TxStatus, tuple[str | None, str]] = {
    # status: (its time column in txn_transaction, in txn_attempt)
    TxStatus.PROCESSED: ("processed_at", "processed_at"),
    TxStatus.COMMITTED: ("committed_at", "ended_at"),
    TxStatus.FAILED: (None, "ended_at"),
}


class TxidRows:
    """The one writer of ``(pipeline, txid)``'s rows in ``txn_transaction`` and ``txn_attempt``
    (and, with :meth:`prune`, of retention's delete of committed txids' rows)."""

    def __init__(self, conn: Connection, pipeline: str, txid: int) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.txid = txid
        self.pruned = False
        """Set by :meth:`locked_record`: the txid has no row because retention pruned it (it
        committed long ago), not because it was never begun."""

    def _txid_row(self) -> ColumnElement[bool]:
        return (TRANSACTIONS.c.pipeline == self.pipeline) & (TRANSACTIONS.c.txid == self.txid)

    def _attempt_row(self, attempt: int) -> ColumnElement[bool]:
        return (
            (ATTEMPTS.c.pipeline == self.pipeline)
            & (ATTEMPTS.c.txid == self.txid)
            & (ATTEMPTS.c.attempt == attempt)
        )

    def emit(self, attempt: int, metadata: Any, lease_until: Any, *, new: bool) -> None:
        """Make ``attempt`` the txid's current one, processing with ``metadata`` (a new txid's
        first attempt, or a replay that resets what the previous attempt recorded)."""
        begun = {
            "attempt": attempt,
            "status": TxStatus.PROCESSING,
            "metadata": metadata,
            "begun_at": func.now(),
            "lease_expires_at": lease_until,
        }
        # waiters wake at the commit (log.changes)
        changed = notify_changed(self.pipeline, self.txid, TxStatus.PROCESSING)
        if new:
            self.conn.execute(
                insert(TRANSACTIONS)
                .values(pipeline=self.pipeline, txid=self.txid, **begun)
                .returning(changed)
            )
        else:
            self.conn.execute(
                update(TRANSACTIONS)
                .where(self._txid_row())
                .values(
                    **begun,
                    output=None,
                    failed_by=None,
                    processed_at=None,
                    lease_holder=None,
                    updated_at=func.now(),
                )
                .returning(changed)
            )
        self.conn.execute(
            insert(ATTEMPTS).values(
                pipeline=self.pipeline,
                txid=self.txid,
                attempt=attempt,
                status=TxStatus.PROCESSING,
                metadata=metadata,
            )
        )

    def move(
        self,
        attempt: int,
        status: TxStatus,
        *,
        output: Mapping[str, Any] | None = _UNSET,
        error: str | None = None,
        failed_by: int | None = None,
    ) -> None:
        """Move ``attempt`` (the current one) to ``status`` in both rows, stamping the time it got
        there; ``output`` (processed) or ``error`` and ``failed_by`` (failed) go to both rows."""
        txid_at, attempt_at = _REACHED_AT[status]
        both: dict[str, Any] = {"status": status}
        if output is not _UNSET:
            both["output"] = output
        txid_values = {**both, "updated_at": func.now()}
        attempt_values = {**both, attempt_at: func.now()}
        if txid_at is not None:
            txid_values[txid_at] = func.now()
        if status is TxStatus.FAILED:
            error = redact_optional(error)  # stored, then shown on the page and in run notes
            txid_values.update(last_error=error, failed_by=failed_by)
            attempt_values.update(error=error, failed_by=failed_by)
        self.conn.execute(
            update(TRANSACTIONS)
            .where(self._txid_row())
            .values(txid_values)
            .returning(notify_changed(self.pipeline, self.txid, status))  # waiters wake at commit
        )
        self.conn.execute(update(ATTEMPTS).where(self._attempt_row(attempt)).values(attempt_values))

    def patch_output(self, attempt: int, patch: Mapping[str, Any]) -> None:
        """Merge ``patch`` into the recorded output of both rows (e.g. a lake table's version)."""
        value = cast_jsonb(patch)
        self.conn.execute(
            update(TRANSACTIONS)
            .where(self._txid_row())
            .values(output=func.coalesce(TRANSACTIONS.c.output, cast_jsonb({})).op("||")(value))
        )
        self.conn.execute(
            update(ATTEMPTS)
            .where(self._attempt_row(attempt))
            .values(output=func.coalesce(ATTEMPTS.c.output, cast_jsonb({})).op("||")(value))
        )

    def add_timings(self, attempt: int, timings: Mapping[str, float]) -> None:
        """Merge ``timings`` (seconds, rounded to ms) into the attempt's, keeping earlier ones."""
        rounded = cast_jsonb({k: round(float(v), 3) for k, v in timings.items()})
        self.conn.execute(
            update(ATTEMPTS)
            .where(self._attempt_row(attempt))
            .values(timings=func.coalesce(ATTEMPTS.c.timings, cast_jsonb({})).op("||")(rounded))
        )

    def extend_claim(self, until: Any) -> None:
        """Let the current attempt's lease last at least ``until`` (a begin resuming a processing
        attempt gives its processing time to (re)start); a longer lease is kept."""
        self.conn.execute(
            update(TRANSACTIONS)
            .where(self._txid_row())
            .values(lease_expires_at=func.greatest(TRANSACTIONS.c.lease_expires_at, until))
        )

    def renew_lease(self, holder: str, timeout: float) -> None:
        """The current attempt's lease lasts ``timeout`` more seconds, held by ``holder``."""
        self.conn.execute(
            update(TRANSACTIONS)
            .where(self._txid_row())
            .values(
                lease_expires_at=func.now() + timedelta(seconds=timeout),
                lease_holder=holder[:LEASE_HOLDER_CHARS],
            )
        )

    def record_response(self, attempt: int, response: FailureResponse) -> None:
        """Record what the failure sensor decided about failed ``attempt``."""
        self.conn.execute(
            update(ATTEMPTS).where(self._attempt_row(attempt)).values(response=response)
        )

    def record_expectations(
        self, attempt: int, outcomes: Sequence[Mapping[str, Any]], *, keep_others: bool = False
    ) -> None:
        """Record each expectation's outcome for ``attempt`` (its commit's audit), replacing what
        was recorded; ``keep_others``: only the same expectations' (a fill audits its outputs)."""
        if keep_others:
            names = {o["expectation"] for o in outcomes}
            recorded = self.conn.execute(
                select(ATTEMPTS.c.expectations).where(self._attempt_row(attempt))
            ).scalar_one_or_none()
            outcomes = [o for o in recorded or () if o["expectation"] not in names] + [*outcomes]
        self.conn.execute(
            update(ATTEMPTS)
            .where(self._attempt_row(attempt))
            .values(expectations=cast_jsonb(list(outcomes)))
        )

    def record_staged(self, attempt: int, job: str, counts: Mapping[str, int]) -> None:
        """Record what ``job`` of ``attempt`` staged (rows per output key), replacing what an
        earlier run of the same job recorded: call it in the transaction of the job's COPY."""
        value = cast_jsonb({job: {k: int(v) for k, v in counts.items()}})
        self.conn.execute(
            update(ATTEMPTS)
            .where(self._attempt_row(attempt))
            .values(staged=func.coalesce(ATTEMPTS.c.staged, cast_jsonb({})).op("||")(value))
        )

    def staged_by_job(self, attempt: int) -> dict[str, dict[str, int]]:
        """What each job of ``attempt`` recorded with :meth:`record_staged`."""
        found = self.conn.execute(
            select(ATTEMPTS.c.staged).where(self._attempt_row(attempt))
        ).scalar_one_or_none()
        return {job: dict(counts) for job, counts in (found or {}).items()}

    def recorded_output(self, attempt: int) -> Mapping[str, Any] | None:
        """The output ``attempt`` recorded (``None``: not processed, or not the current one)."""
        row = self.conn.execute(
            select(TRANSACTIONS.c.output).where(
                self._txid_row(),
                TRANSACTIONS.c.attempt == attempt,
                TRANSACTIONS.c.status == TxStatus.PROCESSED,
            )
        ).one_or_none()
        return None if row is None else dict(row.output or {})

    def current_attempt(self) -> int | None:
        """The txid's current attempt (``None``: never begun, or pruned)."""
        return self.conn.execute(
            select(TRANSACTIONS.c.attempt).where(self._txid_row())
        ).scalar_one_or_none()

    def locked_record(self) -> TxRecord | None:
        """The txid's record holding its row lock (``None``: never begun, or pruned)."""
        with naming_pipeline(self.pipeline):
            row = self.conn.execute(
                select(TRANSACTIONS).where(self._txid_row()).with_for_update()
            ).one_or_none()
        if row is None:
            pruned_through = self.conn.execute(
                select(PIPELINES.c.pruned_through_txid).where(PIPELINES.c.name == self.pipeline)
            ).scalar_one_or_none()
            if pruned_through is None:
                raise UnknownPipelineError("pipeline is not registered", pipeline=self.pipeline)
            self.pruned = self.txid <= int(pruned_through)
            return None
        return record_of(row)

    @staticmethod
    def prune(conn: Connection, pipeline: str, due: range) -> int:
        """Delete the rows of committed txids ``due`` and add them to the pipeline's ``pruned_*``
        totals, in one statement (so the totals never disagree with what is gone); returns how
        many txids went. Only committed rows below the last committed txid go: an in-flight txid
        is never touched, whatever ``due`` says. The caller holds the pipeline's lock."""
        result = conn.execute(
            text(
                """
                WITH doomed AS (
                    SELECT t.txid FROM txn_transaction t JOIN txn_pipeline p ON p.name = t.pipeline
                    WHERE t.pipeline = :p AND t.txid BETWEEN :lo AND :hi
                      AND t.txid < p.last_committed_txid AND t.status = 'committed'
                ), attempts AS (
                    DELETE FROM txn_attempt a USING doomed d
                    WHERE a.pipeline = :p AND a.txid = d.txid
                    RETURNING a.status
                ), txids AS (
                    DELETE FROM txn_transaction t USING doomed d
                    WHERE t.pipeline = :p AND t.txid = d.txid
                    RETURNING t.txid
                )
                UPDATE txn_pipeline SET
                    pruned_txids = pruned_txids + (SELECT count(*) FROM txids),
                    pruned_attempts = pruned_attempts + (SELECT count(*) FROM attempts),
                    pruned_failed_attempts = pruned_failed_attempts
                        + (SELECT count(*) FROM attempts WHERE status = 'failed'),
                    pruned_through_txid = GREATEST(pruned_through_txid, :hi)
                WHERE name = :p
                RETURNING (SELECT count(*) FROM txids) AS txids
                """
            ),
            {"p": pipeline, "lo": due.start, "hi": due.stop - 1},
        ).one()
        return int(result.txids)

    @staticmethod
    def rewind(conn: Connection, pipeline: str, from_txid: int, error: str) -> int:
        """Fail the current attempt of every txid from ``from_txid`` on, committed or in flight
        (a rewind: :mod:`airflow_txn_provider.transactions.rewind`), both rows, with ``error`` and
        ``failed_by`` :data:`~airflow_txn_provider.rules.history.REWOUND_BY`; a committed txid
        loses its commit time. Returns how many txids. The caller holds the pipeline's lock."""
        result = conn.execute(
            text(
                """
                WITH txids AS (
                    UPDATE txn_transaction SET status = 'failed', last_error = :error,
                        failed_by = :by, committed_at = NULL, lease_expires_at = NULL,
                        updated_at = now()
                    WHERE pipeline = :p AND txid >= :n
                    RETURNING txid, attempt
                ), attempts AS (
                    UPDATE txn_attempt a SET status = 'failed', error = :error, failed_by = :by,
                        ended_at = now()
                    FROM txids t WHERE a.pipeline = :p AND a.txid = t.txid
                        AND a.attempt = t.attempt
                )
                SELECT count(*) FROM txids
                """
            ),
            {"p": pipeline, "n": from_txid, "error": redact_optional(error), "by": REWOUND_BY},
        ).scalar_one()
        conn.execute(select(notify_rewound(pipeline)))  # waiters wake at the commit
        return int(result)


def cast_jsonb(value: Mapping[str, Any] | Sequence[Any]) -> Any:
    return sa_cast(literal(json.dumps(value)), JSONB)


@contextlib.contextmanager
def naming_pipeline(pipeline: str) -> Iterator[None]:
    """Name the pipeline in a :class:`CorruptLogError` raised while reading its rows (an unknown
    enum value is found by the column's type, which does not know whose row it reads)."""
    try:
        yield
    except CorruptLogError as err:
        if err.pipeline is not None:
            raise
        raise CorruptLogError(err.detail, pipeline=pipeline) from None


def record_of(row: Row[Any]) -> TxRecord:
    """A ``txn_transaction`` row as the coordinator's record."""
    return TxRecord(
        txid=int(row.txid),
        attempt=int(row.attempt),
        status=row.status,
        metadata=row.metadata,
        output=row.output,
        failed_by=row.failed_by,
        lease_expires_at=row.lease_expires_at,
        lease_holder=row.lease_holder,
        begun_at=row.begun_at,
    )


def _pipeline_row(conn: Connection, pipeline: str, *, lock: bool) -> Row[Any]:
    # The database's clock comes with the pipeline row: leases are judged by it alone.
    query = select(PIPELINES, func.now().label("db_now")).where(PIPELINES.c.name == pipeline)
    row = conn.execute(query.with_for_update(of=PIPELINES) if lock else query).one_or_none()
    if row is None:
        raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
    return row


def lock_pipeline(conn: Connection, pipeline: str) -> Row[Any]:
    """The pipeline's row (with ``db_now``, the database's clock), locked until ``conn``'s
    transaction ends. The one lock every writer of a pipeline's log takes first (the
    transitions, the declaration, retention), so that they run one at a time."""
    return _pipeline_row(conn, pipeline, lock=True)


def load_view(conn: Connection, pipeline: str, *, lock: bool = False) -> PipelineView:
    """A snapshot of ``pipeline`` (under :func:`lock_pipeline` when ``lock``); raises on a
    corrupt log."""
    with naming_pipeline(pipeline):
        prow = _pipeline_row(conn, pipeline, lock=lock)
        last = int(prow.last_committed_txid)
        rows = list(
            conn.execute(
                select(TRANSACTIONS)
                .where(TRANSACTIONS.c.pipeline == pipeline, TRANSACTIONS.c.txid >= max(last, 1))
                .order_by(TRANSACTIONS.c.txid)
            ).all()
        )
    last_metadata = None
    if last > 0:
        if not rows or rows[0].txid != last:
            raise CorruptLogError(
                "the last committed txid has no row in txn_transaction",
                pipeline=pipeline,
                txid=last,
            )
        head = rows.pop(0)
        if head.status is not TxStatus.COMMITTED:
            raise CorruptLogError(
                f"the last committed txid has status {head.status.value!r}",
                pipeline=pipeline,
                txid=last,
                attempt=head.attempt,
            )
        last_metadata = head.metadata
    db_now: datetime = prow.db_now
    return PipelineView(
        pipeline=pipeline,
        source_kind=prow.source_kind,
        max_pending=int(prow.max_pending),
        last_committed=last,
        last_committed_metadata=last_metadata,
        in_flight=tuple(record_of(r) for r in rows),
        now=db_now,
        runs_made_through=int(prow.runs_made_through),
    )


__all__ = [
    "TxidRows",
    "cast_jsonb",
    "load_view",
    "lock_pipeline",
    "naming_pipeline",
    "record_of",
]
