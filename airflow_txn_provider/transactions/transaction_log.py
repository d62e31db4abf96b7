"""The durable transaction log in Postgres: :class:`TransactionLog`, the one object callers use.

Each transition is one explicit database transaction, in one of its rooms.
:mod:`~airflow_txn_provider.transactions.pipeline_transitions` holds the pipeline's row lock, so
"one commit at a time" and "metadata initialised in txid order" hold whoever calls (Airflow may
run a task twice, #23520), and its ``commit`` runs the caller's ``apply`` in that transaction.
:mod:`~airflow_txn_provider.log.txid_transitions` holds only the txid's row, so txids stage in
parallel. Then :mod:`~airflow_txn_provider.transactions.retention`,
:mod:`~airflow_txn_provider.transactions.rewind`,
:mod:`~airflow_txn_provider.transactions.declaration` and :mod:`~airflow_txn_provider.log.reads`.
A txid's rows have one writer (:class:`~airflow_txn_provider.log.rows.TxidRows`), a pipeline one
reader (:func:`~airflow_txn_provider.log.rows.load_view`). ``expire_lease`` fails an attempt whose
lease ran out, by the database's clock. Every public call waits out a restarting database
(:mod:`airflow_txn_provider.utils.retries`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_txn_provider.log import schema
from airflow_txn_provider.log.models import PIPELINES
from airflow_txn_provider.log.reads import LogReads
from airflow_txn_provider.log.txid_transitions import TxidTransitions
from airflow_txn_provider.rules.coordinator import expired_lease
from airflow_txn_provider.transactions.declaration import PipelineDeclarations
from airflow_txn_provider.transactions.pipeline_transitions import PipelineTransitions
from airflow_txn_provider.transactions.retention import LogRetention
from airflow_txn_provider.transactions.rewind import LogRewind
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


class TransactionLog(
    PipelineDeclarations, PipelineTransitions, TxidTransitions, LogRetention, LogRewind, LogReads
):
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

    def expire_leases(self, pipeline: str) -> tuple[int, ...]:
        """Fail the oldest attempt whose lease ran out, if any (with the cascade): what a loop
        that runs the pipeline without Airflow's failure sensors calls now and then."""
        rec = expired_lease(self.view(pipeline))
        return () if rec is None else self.expire_lease(pipeline, rec.txid, rec.attempt)

    def report_run_trouble(self, pipeline: str, trouble: str | None) -> None:
        """Record what the pipeline's waker could not mend in Airflow (``None``: all is well
        again); the time it began is kept while the trouble lasts, for the health endpoint."""
        from sqlalchemy import case, func, update

        row = PIPELINES.c
        since = (
            None
            if trouble is None
            else case((row.run_trouble_since.is_(None), func.now()), else_=row.run_trouble_since)
        )
        for attempt in retrying(self.outage_timeout):
            with attempt, self.engine.begin() as conn:
                conn.execute(
                    update(PIPELINES)
                    .where(row.name == pipeline)
                    .values(run_trouble=trouble, run_trouble_since=since)
                )

    def note_runs_made(self, pipeline: str, through: int) -> None:
        """Note that the DAG runs of the pipeline's txids up to ``through`` were made (a hint
        for the next claim and the waker: :func:`~airflow_txn_provider.rules.waiting.
        runs_to_make`). One statement, never lowering it."""
        from sqlalchemy import update

        row = PIPELINES.c
        with self.engine.begin() as conn:
            conn.execute(
                update(PIPELINES)
                .where(row.name == pipeline, row.runs_made_through < through)
                .values(runs_made_through=through)
            )


__all__ = ["TransactionLog", "engine_from_url"]
