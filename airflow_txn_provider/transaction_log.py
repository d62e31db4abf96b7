"""The durable transaction log in Postgres: the coordinator's rules applied under row locks.

Every transition is one explicit database transaction:

* ``begin``, ``fail``, ``recover`` and ``commit`` lock the pipeline's row (``SELECT … FOR UPDATE``),
  read a :class:`~airflow_txn_provider.coordinator.PipelineView`, ask the pure coordinator, and
  write its answer. The lock makes "one commit at a time per pipeline" and "metadata initialised in
  txid order" hold in Postgres, whoever calls (Airflow may run the same task twice, #23520).
* ``mark_processed`` and ``stage_output`` lock only the txid's own row, so many txids record their
  processed output in parallel; a commit or failure of that txid waits for the row and sees the
  result.
* ``commit`` runs the caller's ``apply`` (the states' and lake sinks' steps of the commit
  protocol, :mod:`airflow_txn_provider.commit`) on the same connection, so the state change and
  the "committed" mark are one database transaction: both happen or neither.
* **retention**: a commit also deletes the rows of txids older than the newest ``keep_txids``
  committed ones (a bounded batch, under the pipeline's lock it holds anyway) and adds them to the
  pipeline's ``pruned_*`` totals (:meth:`TransactionLog.retention`). Nothing a rule reads is pruned
  (:func:`~airflow_txn_provider.coordinator.retention_horizon`).
* a processing attempt holds a **lease** (``renew_lease``) while its process is alive; once it runs
  out, ``expire_lease`` fails the attempt (with the cascade) so the txid replays: an attempt whose
  process died is never left in flight. Leases are judged by the database's clock, and again
  once the expiry holds the txid's row: a staging that recorded the output meanwhile is not failed.

A txid's rows are written by one writer (:class:`~airflow_txn_provider.log_rows.TxidRows`), and a
pipeline is read by one reader (:func:`~airflow_txn_provider.log_rows.load_view`). Every public
call waits out a restarting database (:mod:`airflow_txn_provider.retries`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import create_engine, delete, exists, func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import make_url

from airflow_txn_provider import __version__, schema
from airflow_txn_provider.coordinator import (
    DEFAULT_KEEP_TXIDS,
    LEASE_HOLDER_CHARS,
    PRUNE_BATCH,
    PRUNE_EVERY,
    BeginAction,
    BeginPlan,
    CommitAction,
    FailureResponse,
    LeaseRenewal,
    PipelineView,
    ProcessedAction,
    SourceKind,
    TxRecord,
    TxStatus,
    attempt_is_current,
    attempt_may_stage,
    expired_lease,
    lease_renewal,
    next_to_begin,
    plan_begin,
    plan_commit,
    plan_expiry,
    plan_failure,
    plan_processed,
    plan_recovery,
    prune_range,
    validate_keep_txids,
    validate_max_pending,
)
from airflow_txn_provider.exceptions import (
    LeaseExpiredError,
    PipelineConfigError,
    SourceError,
    TxnError,
    UnknownPipelineError,
)
from airflow_txn_provider.log_rows import TxidRows, load_view, naming_pipeline
from airflow_txn_provider.models import ATTEMPTS, PIPELINE_DAGS, PIPELINES, TRANSACTIONS
from airflow_txn_provider.retries import (
    DEFAULT_OUTAGE_TIMEOUT,
    is_transient,
    retry_transient,
    retrying,
)
from airflow_txn_provider.sources import Source, validate_metadata

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine, Row

log = logging.getLogger(__name__)


CLAIM_TIMEOUT = 120.0
"""Seconds a freshly begun attempt's lease lasts: time for its processing task to start and take
the lease over (it renews every few seconds from then on)."""
LEASE_TIMEOUT = 30.0
"""Seconds a processing attempt's lease lasts after each renewal, unless the pipeline says."""


class DeclaredState(Protocol):
    """What :meth:`TransactionLog.ensure_pipeline` needs of a state (``MapState`` has it)."""

    @property
    def name(self) -> str: ...

    def definition(self) -> Mapping[str, Any]: ...

    def create(self, bind: Engine) -> Any: ...


def declaration_fingerprint(
    source_kind: SourceKind | str,
    max_pending: int,
    dag_id: str | None,
    states: Sequence[DeclaredState],
    keep_txids: int = DEFAULT_KEEP_TXIDS,
) -> str:
    """A digest of everything registration writes, and of this library's version (a new version
    may add to the state tables' DDL): equal digests, nothing to register again."""
    declared = {
        "library": __version__,
        "schema": schema.HEAD_REVISION,
        "source_kind": SourceKind(source_kind).value,
        "max_pending": max_pending,
        "keep_txids": keep_txids,
        "dag_id": dag_id,
        "states": [[s.name, dict(s.definition())] for s in states],
    }
    return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()


ApplyFn = Callable[["Connection", TxRecord], "Mapping[str, Any] | None"]
StageFn = Callable[["Connection"], "Mapping[str, Any] | None"]


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


@dataclass(frozen=True)
class RetentionInfo:
    """A pipeline's retention setting and what it pruned so far (every pruned txid committed)."""

    pipeline: str
    keep_txids: int
    pruned_txids: int
    pruned_attempts: int
    pruned_failed_attempts: int
    """Attempts of pruned txids that had failed (each was replayed before its txid committed)."""
    pruned_through_txid: int
    """Every txid up to this one was pruned (0: none)."""


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


SNAPSHOT = "REPEATABLE READ"
"""Isolation level of unlocked reads of a pipeline: its statements see one snapshot."""


DRIVER = "psycopg"
"""The log's driver: psycopg 3, whose binary ``COPY`` stages partial results (no text round trip:
every key is stored as it is, a carriage return included)."""


def engine_from_url(url: str, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine for a Postgres URL, always with the psycopg (3) driver: a bare
    ``postgresql://`` or a ``postgresql+psycopg2://`` URL names the same database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"the transaction log needs Postgres, got a {parsed.drivername!r} URL")
    if parsed.get_driver_name() not in (DRIVER, "psycopg2"):
        raise ValueError(
            f"the transaction log connects with {DRIVER} (it stages with COPY), got a "
            f"{parsed.drivername!r} URL: use postgresql:// or postgresql+{DRIVER}://"
        )
    parsed = parsed.set(drivername=f"postgresql+{DRIVER}")
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


class TransactionLog:
    """The transaction log of every pipeline stored in one Postgres database.

    :param engine: a SQLAlchemy engine on Postgres (see :func:`engine_from_url`, or
        :class:`~airflow_txn_provider.hooks.txn_log.TxnLogHook` for an Airflow connection).
    :param migrate: apply the schema migrations if the database is behind (default). With
        ``False``, a database that is behind raises :class:`SchemaTooOldError`.
    :param outage_timeout: seconds each call waits for a restarting database before it raises
        (``0``: no retries).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        migrate: bool = True,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
    ) -> None:
        if engine.dialect.driver != DRIVER:  # staging would fail later, mid-txid
            raise ValueError(
                f"the transaction log needs a postgresql+{DRIVER} engine (it stages with COPY), "
                f"got {engine.url.drivername!r}; see engine_from_url"
            )
        self.engine = engine
        self.outage_timeout = outage_timeout
        for attempt in retrying(outage_timeout):
            with attempt:
                schema.ensure(engine, migrate=migrate)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        migrate: bool = True,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        **engine_kwargs: Any,
    ) -> TransactionLog:
        return cls(
            engine_from_url(url, **engine_kwargs), migrate=migrate, outage_timeout=outage_timeout
        )

    # -- pipelines -----------------------------------------------------------------------------

    @retry_transient
    def register_pipeline(
        self,
        name: str,
        *,
        source_kind: SourceKind | str,
        max_pending: int,
        dag_id: str | None = None,
        keep_txids: int | None = None,
    ) -> None:
        """Create the pipeline, or check an existing one (its ``max_pending`` and ``keep_txids``
        may change).

        :param dag_id: the Airflow DAG that runs it, recorded for the Transactions page.
        :param keep_txids: retention: how many of the newest committed txids keep their rows
            (``None``: leave it as it is; a new pipeline gets ``DEFAULT_KEEP_TXIDS``).
        """
        if not name or len(name) > 250:
            raise ValueError(f"pipeline name must have 1 to 250 characters, got {name!r}")
        kind = SourceKind(source_kind)
        validate_max_pending(max_pending)
        if keep_txids is not None:
            validate_keep_txids(keep_txids)
        with self.engine.begin() as conn:
            conn.execute(
                pg_insert(PIPELINES)
                .values(
                    name=name,
                    source_kind=kind,
                    max_pending=max_pending,
                    keep_txids=keep_txids or DEFAULT_KEEP_TXIDS,
                )
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = conn.execute(
                select(PIPELINES).where(PIPELINES.c.name == name).with_for_update()
            ).one()
            if row.source_kind is not kind:
                raise PipelineConfigError(
                    f"pipeline was registered with a {row.source_kind} source, now declared "
                    f"{kind.value}; a running pipeline cannot change its replay semantics",
                    pipeline=name,
                )
            if dag_id:
                conn.execute(
                    pg_insert(PIPELINE_DAGS)
                    .values(pipeline=name, dag_id=dag_id)
                    .on_conflict_do_nothing()
                )
            for setting, value in (("max_pending", max_pending), ("keep_txids", keep_txids)):
                if value is None or getattr(row, setting) == value:
                    continue
                conn.execute(
                    update(PIPELINES)
                    .where(PIPELINES.c.name == name)
                    .values({setting: value, "updated_at": func.now()})
                )
                log.info(
                    "pipeline=%s %s changed from %s to %s",
                    name,
                    setting,
                    getattr(row, setting),
                    value,
                )

    def ensure_pipeline(
        self,
        name: str,
        *,
        source_kind: SourceKind | str,
        max_pending: int,
        dag_id: str | None = None,
        states: Sequence[DeclaredState] = (),
        keep_txids: int = DEFAULT_KEEP_TXIDS,
    ) -> bool:
        """Register the pipeline and create its states, unless the log holds this very
        declaration already: then it is one read, with no lock and no DDL (every begin calls it,
        each no-data poll included). Returns whether it registered."""
        declaration = declaration_fingerprint(source_kind, max_pending, dag_id, states, keep_txids)
        if self._declaration(name, dag_id) == declaration:
            return False
        self.register_pipeline(
            name,
            source_kind=source_kind,
            max_pending=max_pending,
            dag_id=dag_id,
            keep_txids=keep_txids,
        )
        for state in states:
            state.create(self.engine)
        self._set_declaration(name, declaration)
        log.info("pipeline=%s registered (declaration %s)", name, declaration[:12])
        return True

    @retry_transient
    def _declaration(self, name: str, dag_id: str | None = None) -> str | None:
        """The pipeline's stored declaration; ``None`` while the log holds no pairing of it with
        ``dag_id`` (deleted by :meth:`forget_pipeline_dags` while the DAG ran another pipeline):
        registering again records it."""
        query = select(PIPELINES.c.declaration).where(PIPELINES.c.name == name)
        if dag_id:
            paired = (PIPELINE_DAGS.c.pipeline == name) & (PIPELINE_DAGS.c.dag_id == dag_id)
            query = query.where(exists().where(paired))
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    @retry_transient
    def _set_declaration(self, name: str, declaration: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(PIPELINES).where(PIPELINES.c.name == name).values(declaration=declaration)
            )

    @retry_transient
    def pipelines(self) -> list[str]:
        """Names of every registered pipeline, sorted (one query, no lock). Names only: reading
        a pipeline (``view``) is where a corrupt row is reported, for that pipeline alone."""
        with self.engine.connect() as conn:
            return list(conn.execute(select(PIPELINES.c.name).order_by(PIPELINES.c.name)).scalars())

    @retry_transient
    def pipeline_dags(self) -> dict[str, set[str]]:
        """Pipeline -> ids of the Airflow DAGs recorded as running it."""
        found: dict[str, set[str]] = {}
        with self.engine.connect() as conn:
            for pipeline, dag_id in conn.execute(
                select(PIPELINE_DAGS.c.pipeline, PIPELINE_DAGS.c.dag_id)
            ):
                found.setdefault(pipeline, set()).add(dag_id)
        return found

    @retry_transient
    def forget_pipeline_dags(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Delete these ``(pipeline, dag_id)`` pairings: their DAG was deleted, or its id runs
        another pipeline now (the rule is the Transactions page's,
        :func:`airflow_txn_provider.ui.reader.pipeline_dags`). Returns how many there were."""
        pairs = sorted(set(pairs))
        if not pairs:
            return 0
        pair = tuple_(PIPELINE_DAGS.c.pipeline, PIPELINE_DAGS.c.dag_id)
        with self.engine.begin() as conn:
            return conn.execute(delete(PIPELINE_DAGS).where(pair.in_(pairs))).rowcount

    @retry_transient
    def view(self, pipeline: str) -> PipelineView:
        """A consistent snapshot of the pipeline (no lock is held after it returns)."""
        # Two statements read it (pipeline row, then txid rows): without one snapshot for both, a
        # commit landing between them looks like a corrupt log (a committed txid in flight).
        with self.engine.connect().execution_options(isolation_level=SNAPSHOT) as conn:
            return self._view(conn, pipeline, lock=False)

    @retry_transient
    def last_committed(self, pipeline: str) -> int:
        with self.engine.connect() as conn:
            value = conn.execute(
                select(PIPELINES.c.last_committed_txid).where(PIPELINES.c.name == pipeline)
            ).scalar_one_or_none()
        if value is None:
            raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
        return int(value)

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
        _prefetch(source)
        with self.engine.begin() as conn:
            view = self._view(conn, pipeline, lock=True)
            self._check_source(view, source)
            return self._begin_locked(conn, view, txid, source, claim_timeout, replay=replay)

    @retry_transient
    def begin_next(self, pipeline: str, source: Source) -> Emission | None:
        """Emit whatever txid should go next (oldest failed first, else a new one); ``None`` if the
        window is full."""
        _prefetch(source)
        with self.engine.begin() as conn:
            view = self._view(conn, pipeline, lock=True)
            self._check_source(view, source)
            txid = next_to_begin(view)
            if txid is None:
                return None
            return self._begin_locked(conn, view, txid, source, CLAIM_TIMEOUT)

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
            self._locked_record(conn, view.pipeline, txid)
            view = self._view(conn, view.pipeline, lock=False)
            plan = plan_begin(view, txid, replay=replay)
        claim = func.now() + timedelta(seconds=claim_timeout)
        if plan.action is BeginAction.RESUME:
            rec = view.record(txid)
            assert rec is not None
            if rec.status is TxStatus.PROCESSING:  # give its processing time to (re)start
                conn.execute(
                    update(TRANSACTIONS)
                    .where(TRANSACTIONS.c.pipeline == view.pipeline, TRANSACTIONS.c.txid == txid)
                    .values(lease_expires_at=func.greatest(TRANSACTIONS.c.lease_expires_at, claim))
                )
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
        if plan.reuse_metadata:
            rec = view.record(plan.txid)
            assert rec is not None
            return rec.metadata
        try:
            metadata = source.initialize_transaction(plan.txid, plan.prev_metadata)
        except TxnError as err:
            if err.pipeline is not None:
                raise
            # A source knows no pipeline (e.g. next_offset_ranges): name the one it failed for.
            raise type(err)(
                err.detail, pipeline=view.pipeline, txid=plan.txid, attempt=plan.attempt
            ) from err
        except Exception as err:
            raise SourceError(
                f"{type(source).__name__}.initialize_transaction failed: {err}",
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

    # -- processed -------------------------------------------------------------------------------

    def mark_processed(
        self, pipeline: str, txid: int, attempt: int, output: Mapping[str, Any] | None = None
    ) -> ProcessedAction:
        """Record that ``(txid, attempt)`` finished processing, with a reference to its output.

        A report from an attempt that is no longer current is ignored (``IGNORE_STALE``); a repeat
        of the same report is a no-op (``DUPLICATE``).
        """
        return self.stage_output(pipeline, txid, attempt, lambda conn: output)

    @retry_transient
    def stage(
        self,
        pipeline: str,
        txid: int,
        attempt: int,
        stage: StageFn,
        *,
        job: str = "",
        timings: Mapping[str, float] | None = None,
    ) -> bool:
        """Run ``stage(conn)`` only while ``(txid, attempt)`` is current and still processing.

        For a txid with several processing jobs: each stages its part fenced by the attempt, and
        the last step records the processed output
        (:func:`~airflow_txn_provider.commit.record_processed`). ``stage`` returns what it staged,
        ``{output key: rows}``; it is recorded as ``job``'s in the attempt's logged row, in the
        same database transaction as the COPY, so staging lost later (the tables are UNLOGGED) is
        found by its content. Returns False (and stages nothing) for a stale attempt.
        """
        with self.engine.begin() as conn:
            record = self._locked_record(conn, pipeline, txid)
            if attempt_may_stage(record, pipeline=pipeline, txid=txid, attempt=attempt):
                counts = stage(conn)
                if not isinstance(counts, Mapping):
                    raise TypeError(
                        f"stage() must return what it staged as {{output key: rows}}, got "
                        f"{counts!r}"
                    )
                rows = TxidRows(conn, pipeline, txid)
                rows.record_staged(
                    attempt, job, {k: v for k, v in counts.items() if isinstance(v, int)}
                )
                if timings:
                    rows.add_timings(attempt, timings)
                return True
        log.warning(
            "pipeline=%s txid=%s attempt=%s staged nothing: attempt is stale or already processed",
            pipeline,
            txid,
            attempt,
        )
        return False

    @retry_transient
    def stage_output(
        self,
        pipeline: str,
        txid: int,
        attempt: int,
        stage: StageFn,
        *,
        timings: Mapping[str, float] | None = None,
    ) -> ProcessedAction:
        """Stage ``(txid, attempt)``'s output and mark it processed, in one database transaction.

        ``stage(conn)`` writes the output (e.g. :meth:`MapState.stage`) and returns a reference to
        it, such as row counts. It runs only while the attempt is current, holding the txid's row
        lock, so a duplicate run of the same attempt replaces rather than doubles the staged rows
        and an attempt that was failed meanwhile stages nothing. ``timings`` (seconds per phase;
        ``stage`` may still add to it) are recorded on the attempt.
        """
        output_dict: dict[str, Any] | None = None
        with self.engine.begin() as conn:
            record = self._locked_record(conn, pipeline, txid)
            if attempt_is_current(record, pipeline=pipeline, txid=txid, attempt=attempt):
                output = stage(conn)
                output_dict = None if output is None else dict(output)
            action = plan_processed(
                record, pipeline=pipeline, txid=txid, attempt=attempt, output=output_dict
            )
            if action is ProcessedAction.ACCEPT:
                rows = TxidRows(conn, pipeline, txid)
                rows.move(attempt, TxStatus.PROCESSED, output=output_dict)
                if timings:
                    rows.add_timings(attempt, timings)
        if action is ProcessedAction.IGNORE_STALE:
            log.warning(
                "pipeline=%s txid=%s attempt=%s processed report ignored: attempt is stale",
                pipeline,
                txid,
                attempt,
            )
        else:
            log.info(
                "pipeline=%s txid=%s attempt=%s processed (%s)",
                pipeline,
                txid,
                attempt,
                action.value,
            )
        return action

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
                view = self._view(conn, pipeline, lock=True)
                action = plan_commit(view, txid, attempt)
                if action is CommitAction.ALREADY_COMMITTED:
                    # 0 once retention pruned the txid's record: committed, attempt forgotten.
                    committed_attempt = (
                        conn.execute(
                            select(TRANSACTIONS.c.attempt).where(
                                TRANSACTIONS.c.pipeline == pipeline, TRANSACTIONS.c.txid == txid
                            )
                        ).scalar_one_or_none()
                        or 0
                    )
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
                    txid, kept.keep_txids, kept.pruned_through_txid, every=PRUNE_EVERY
                )
                if due:
                    self._prune_locked(conn, pipeline, due)
        except _ApplyFailed as failed:
            error = failed.__cause__
            self.fail(pipeline, txid, attempt, error=f"commit failed: {error}")
            assert error is not None
            raise error from None
        log.info("pipeline=%s txid=%s attempt=%s committed", pipeline, txid, attempt)
        return CommitResult(pipeline, txid, attempt, True, attempt, details)

    # -- retention -------------------------------------------------------------------------------

    @retry_transient
    def prune(self, pipeline: str, *, batch: int = PRUNE_BATCH) -> int:
        """Delete the rows of up to ``batch`` txids that retention lets go (what each commit does
        now and then, by itself); returns how many txids were pruned. Takes the pipeline's lock:
        safe beside commits, and idempotent."""
        with self.engine.begin() as conn:
            row = conn.execute(
                select(
                    PIPELINES.c.last_committed_txid,
                    PIPELINES.c.keep_txids,
                    PIPELINES.c.pruned_through_txid,
                )
                .where(PIPELINES.c.name == pipeline)
                .with_for_update()
            ).one_or_none()
            if row is None:
                raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
            due = prune_range(
                int(row.last_committed_txid),
                int(row.keep_txids),
                int(row.pruned_through_txid),
                batch=batch,
            )
            return self._prune_locked(conn, pipeline, due) if due else 0

    @staticmethod
    def _prune_locked(conn: Connection, pipeline: str, due: range) -> int:
        """Delete the rows of committed txids ``due`` (holding the pipeline's lock) and add them
        to the pipeline's totals, in one statement. Only committed rows at or below the last
        committed txid go: an in-flight txid is never touched, whatever ``due`` says."""
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
        pruned = int(result.txids)
        log.info(
            "pipeline=%s retention pruned %s txid(s) %s..%s", pipeline, pruned, due.start, due[-1]
        )
        return pruned

    @retry_transient
    def retention(self, pipeline: str) -> RetentionInfo:
        """The pipeline's ``keep_txids`` and the totals of what retention pruned."""
        with self.engine.connect() as conn:
            row = conn.execute(select(PIPELINES).where(PIPELINES.c.name == pipeline)).one_or_none()
        if row is None:
            raise UnknownPipelineError("pipeline is not registered", pipeline=pipeline)
        return RetentionInfo(
            pipeline=pipeline,
            keep_txids=int(row.keep_txids),
            pruned_txids=int(row.pruned_txids),
            pruned_attempts=int(row.pruned_attempts),
            pruned_failed_attempts=int(row.pruned_failed_attempts),
            pruned_through_txid=int(row.pruned_through_txid),
        )

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
    ) -> tuple[int, ...]:
        """Fail ``(txid, attempt)`` and every later txid in flight; return the txids failed.

        A report from an attempt that is no longer current fails nothing. ``of_processing``: the
        report is a processing task's or job's; an attempt whose output is recorded already is
        kept (it commits), since the failure came after its work was done. ``holder``: the
        reporting process's lease holder name; a report from a process whose lease another took
        over fails nothing (:func:`~airflow_txn_provider.coordinator.plan_failure`).
        """
        with self.engine.begin() as conn:
            view = self._view(conn, pipeline, lock=True)
            txids = plan_failure(view, txid, attempt, of_processing=of_processing, reporter=holder)
            self._fail_locked(conn, view, txids, origin=txid, error=error or "failed")
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
            view = self._view(conn, pipeline, lock=True)
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
    def renew_lease(
        self, pipeline: str, txid: int, attempt: int, *, holder: str, timeout: float
    ) -> LeaseRenewal:
        """Prove that ``(txid, attempt)``'s process is alive for ``timeout`` more seconds.

        ``RENEWED`` while it processes; ``DONE`` once its output is recorded (nothing left to
        renew); ``LOST`` once it is failed or replaced (its process should stop: nothing it stages
        will count). Locks the txid's row only, never the pipeline.
        """
        with self.engine.begin() as conn:
            record = self._locked_record(conn, pipeline, txid)
            found = lease_renewal(record, attempt)
            if found is LeaseRenewal.RENEWED:
                conn.execute(
                    update(TRANSACTIONS)
                    .where(TRANSACTIONS.c.pipeline == pipeline, TRANSACTIONS.c.txid == txid)
                    .values(
                        lease_expires_at=func.now() + timedelta(seconds=timeout),
                        lease_holder=holder[:LEASE_HOLDER_CHARS],
                    )
                )
        return found

    @retry_transient
    def expire_lease(self, pipeline: str, txid: int, attempt: int) -> tuple[int, ...]:
        """Fail ``(txid, attempt)`` and every later txid in flight if its lease ran out (by the
        database's clock); return the txids failed. Fails nothing while the lease is alive or
        once the attempt is no longer current, so a watcher may call it as often as it likes."""
        with self.engine.begin() as conn:
            view = self._view(conn, pipeline, lock=True)
            txids = plan_expiry(view, txid, attempt)
            if txids:
                # The view read the txid without its row lock: a staging (which holds only that
                # lock, for as long as its COPY runs and blocks renewals meanwhile) may be about
                # to record the output. Wait for the row, then judge again by what it holds.
                self._locked_record(conn, pipeline, txid)
                view = self._view(conn, pipeline, lock=False)
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
        return txids

    def expire_leases(self, pipeline: str) -> tuple[int, ...]:
        """Fail the oldest attempt whose lease ran out, if any (with the cascade): what a loop
        that runs the pipeline without Airflow's failure sensors calls now and then."""
        rec = expired_lease(self.view(pipeline))
        return () if rec is None else self.expire_lease(pipeline, rec.txid, rec.attempt)

    # -- reading ---------------------------------------------------------------------------------

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
            )
            for r in self._attempt_rows(pipeline, txid)
        ]

    @retry_transient
    def history(self, pipeline: str, txid: int) -> tuple[TxRecord, ...]:
        """Every attempt of ``txid`` as the coordinator's records, oldest first: what the failure
        sensor's rules (:func:`~airflow_txn_provider.waiting.respond_to_failure`) read."""
        return tuple(
            TxRecord(
                txid=int(r.txid),
                attempt=int(r.attempt),
                status=r.status,
                failed_by=r.failed_by,
                response=r.response,
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

    @retry_transient
    def record_response(
        self, pipeline: str, txid: int, attempt: int, response: FailureResponse
    ) -> None:
        """Record what the failure sensor decided about failed ``(txid, attempt)``, so a retry of
        the sensor neither acts twice nor counts the txid's own failures again."""
        with self.engine.begin() as conn:
            conn.execute(
                update(ATTEMPTS)
                .where(
                    ATTEMPTS.c.pipeline == pipeline,
                    ATTEMPTS.c.txid == txid,
                    ATTEMPTS.c.attempt == attempt,
                )
                .values(response=response)
            )

    # -- loading ---------------------------------------------------------------------------------

    def _view(self, conn: Connection, pipeline: str, *, lock: bool) -> PipelineView:
        return load_view(conn, pipeline, lock=lock)

    def _locked_record(self, conn: Connection, pipeline: str, txid: int) -> TxRecord | None:
        return TxidRows(conn, pipeline, txid).locked_record()


class _ApplyFailed(Exception):
    """Internal: marks an exception raised by the caller's ``apply`` (see ``commit``)."""


def _prefetch(source: Source) -> None:
    """Let the source read what it can before the pipeline's lock is taken (see
    :meth:`Source.prefetch`); its errors are raised, naming the txid, under the lock."""
    try:
        source.prefetch()
    except Exception as err:
        log.debug("%s.prefetch failed (retried under the lock): %s", type(source).__name__, err)


__all__ = [
    "AttemptInfo",
    "CommitResult",
    "Emission",
    "RetentionInfo",
    "TransactionInfo",
    "TransactionLog",
    "engine_from_url",
]
