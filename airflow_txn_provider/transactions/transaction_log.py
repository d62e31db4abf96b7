"""The durable transaction log in Postgres: :class:`TransactionLog`, the one object callers use,
put together from named parts, each one module and each call one database transaction (a txid's
rows have one writer, :class:`~airflow_txn_provider.log.rows.TxidRows`; a pipeline one reader,
:func:`~airflow_txn_provider.log.rows.load_view`). Every public call waits out a restarting
database (:mod:`airflow_txn_provider.utils.retries`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_txn_provider.log import schema
from airflow_txn_provider.log.part import PartCall
from airflow_txn_provider.log.reads import LogReads
from airflow_txn_provider.log.txid_transitions import TxidTransitions
from airflow_txn_provider.rules.coordinator import expired_lease
from airflow_txn_provider.transactions.declaration import PipelineDeclarations
from airflow_txn_provider.transactions.pipeline_transitions import PipelineTransitions
from airflow_txn_provider.transactions.retention import LogRetention
from airflow_txn_provider.transactions.rewind import LogRewind
from airflow_txn_provider.transactions.waker_notes import WakerNotes
from airflow_txn_provider.utils.credentials import LOG_DRIVER
from airflow_txn_provider.utils.retries import DEFAULT_OUTAGE_TIMEOUT, retrying

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

DRIVER = LOG_DRIVER


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

    Each part is an attribute (``txlog.pipeline_transitions``, ``txlog.reads``, ...); each
    public call below names the part that does it.
    """

    declarations: PipelineDeclarations
    """What a DAG file declares: pipelines, their outputs and the DAGs that run them."""
    pipeline_transitions: PipelineTransitions
    """What the coordinator does to a pipeline, under its row lock: begin, commit, fail."""
    txid_transitions: TxidTransitions
    """What a job does to its txid, under the txid's row lock: stage, processed, lease."""
    pruning: LogRetention
    """Retention: pruning committed txids, and what it pruned."""
    rewinding: LogRewind
    """Rewinding the pipeline to txid N."""
    reads: LogReads
    """What the page, the sensor and the waker read, no lock held."""
    waker_notes: WakerNotes
    """What the waker notes on a pipeline's row: runs made, trouble."""

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
        self._outage_timeout = outage_timeout
        self.engine = engine
        for attempt in retrying(outage_timeout):
            with attempt:
                schema.ensure(engine, migrate=migrate)

    @property
    def outage_timeout(self) -> float:
        """Seconds each call waits for a restarting database; read-only: the parts took it when
        they were made (``TransactionLog(engine, outage_timeout=...)`` for another)."""
        return self._outage_timeout

    @property
    def engine(self) -> Engine:
        return self._engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        """The parts are (re)made on the engine, so every part uses the log's engine."""
        self._engine = engine
        on = (engine, self._outage_timeout)
        self.declarations = PipelineDeclarations(*on)
        self.pipeline_transitions = PipelineTransitions(*on)
        self.txid_transitions = TxidTransitions(*on)
        self.pruning = LogRetention(*on)
        self.rewinding = LogRewind(*on)
        self.reads = LogReads(*on)
        self.waker_notes = WakerNotes(*on)

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

    register_pipeline = PartCall("declarations", PipelineDeclarations.register_pipeline)
    ensure_pipeline = PartCall("declarations", PipelineDeclarations.ensure_pipeline)
    fit_window = PartCall("declarations", PipelineDeclarations.fit_window)
    pipeline_dags = PartCall("declarations", PipelineDeclarations.pipeline_dags)
    forget_pipeline_dags = PartCall("declarations", PipelineDeclarations.forget_pipeline_dags)

    begin = PartCall("pipeline_transitions", PipelineTransitions.begin)
    begin_next = PartCall("pipeline_transitions", PipelineTransitions.begin_next)
    commit = PartCall("pipeline_transitions", PipelineTransitions.commit)
    fail = PartCall("pipeline_transitions", PipelineTransitions.fail)
    recover = PartCall("pipeline_transitions", PipelineTransitions.recover)
    expire_lease = PartCall("pipeline_transitions", PipelineTransitions.expire_lease)

    mark_processed = PartCall("txid_transitions", TxidTransitions.mark_processed)
    stage = PartCall("txid_transitions", TxidTransitions.stage)
    stage_output = PartCall("txid_transitions", TxidTransitions.stage_output)
    renew_lease = PartCall("txid_transitions", TxidTransitions.renew_lease)
    record_response = PartCall("txid_transitions", TxidTransitions.record_response)

    prune = PartCall("pruning", LogRetention.prune)
    retention = PartCall("pruning", LogRetention.retention)

    rewind = PartCall("rewinding", LogRewind.rewind)
    follow_lake_tables = PartCall("rewinding", LogRewind.follow_lake_tables)

    pipelines = PartCall("reads", LogReads.pipelines)
    view = PartCall("reads", LogReads.view)
    last_committed = PartCall("reads", LogReads.last_committed)
    transactions = PartCall("reads", LogReads.transactions)
    transaction = PartCall("reads", LogReads.transaction)
    attempts = PartCall("reads", LogReads.attempts)
    history = PartCall("reads", LogReads.history)

    report_run_trouble = PartCall("waker_notes", WakerNotes.report_run_trouble)
    note_runs_made = PartCall("waker_notes", WakerNotes.note_runs_made)

    def expire_leases(self, pipeline: str) -> tuple[int, ...]:
        """Fail the oldest attempt whose lease ran out, if any (with the cascade): what a loop
        that runs the pipeline without Airflow's failure sensors calls now and then."""
        rec = expired_lease(self.reads.view(pipeline))
        if rec is None:
            return ()
        return self.pipeline_transitions.expire_lease(pipeline, rec.txid, rec.attempt)


__all__ = ["TransactionLog", "engine_from_url"]
