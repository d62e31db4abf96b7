"""The durable transaction log in Postgres: :class:`TransactionLog`, the one object callers use.

It is made of rooms, each owning one kind of call; every transition is one explicit database
transaction:

* :mod:`~airflow_txn_provider.transactions.pipeline_transitions`: ``begin``, ``commit``, ``fail``,
  ``recover`` and ``expire_lease`` lock the pipeline's row (``rows.lock_pipeline``), read a
  :class:`~airflow_txn_provider.rules.records.PipelineView`, ask the pure coordinator, and write its
  answer. The lock makes "one commit at a time per pipeline" and "metadata initialised in txid
  order" hold in Postgres, whoever calls (Airflow may run the same task twice, #23520).
  ``commit`` runs the caller's ``apply`` (the states' and lake sinks' steps of the commit
  protocol, :mod:`airflow_txn_provider.transactions.commit`) on the same connection, so the state
  change and the "committed" mark are one database transaction: both happen or neither.
* :mod:`~airflow_txn_provider.log.txid_transitions`: ``mark_processed``, ``stage_output``, ``stage``
  and ``renew_lease`` lock only the txid's own row, so many txids record their processed output
  in parallel; a commit or failure of that txid waits for the row and sees the result.
* :mod:`~airflow_txn_provider.transactions.retention`: a commit also deletes the rows of txids
  older than the newest ``keep_txids`` committed ones (a bounded batch, under the pipeline's lock it
  holds anyway) and adds them to the pipeline's ``pruned_*`` totals
  (:meth:`TransactionLog.retention`). Nothing a rule reads is pruned
  (:func:`~airflow_txn_provider.rules.history.retention_horizon`).
* :mod:`~airflow_txn_provider.transactions.rewind`: ``rewind`` undoes the commits of txid N and
  later (every Postgres state restored from the undo records each commit writes) and re-queues every
  txid from N, in one database transaction under the pipeline's lock.
* :mod:`~airflow_txn_provider.transactions.declaration`: ``register_pipeline``, ``ensure_pipeline``
  and the DAGs recorded as running a pipeline.
* :mod:`~airflow_txn_provider.log.reads`: ``view``, ``transactions``, ``attempts``, ``history``
  and the other reads, without a lock.

A processing attempt holds a **lease** (``renew_lease``) while its process is alive; once it runs
out, ``expire_lease`` fails the attempt (with the cascade) so the txid replays: an attempt whose
process died is never left in flight. Leases are judged by the database's clock, and again once
the expiry holds the txid's row: a staging that recorded the output meanwhile is not failed.

A txid's rows are written by one writer (:class:`~airflow_txn_provider.log.rows.TxidRows`), and a
pipeline is read by one reader (:func:`~airflow_txn_provider.log.rows.load_view`). Every public
call waits out a restarting database (:mod:`airflow_txn_provider.utils.retries`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from airflow_txn_provider.log import schema
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

        from airflow_txn_provider.log.models import PIPELINES

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

        from airflow_txn_provider.log.models import PIPELINES

        row = PIPELINES.c
        with self.engine.begin() as conn:
            conn.execute(
                update(PIPELINES)
                .where(row.name == pipeline, row.runs_made_through < through)
                .values(runs_made_through=through)
            )


__all__ = ["TransactionLog", "engine_from_url"]
