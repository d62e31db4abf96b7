"""What the waker notes on a pipeline's row (:class:`WakerNotes`, a part of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`): hints and trouble
for the next claim, the waker itself and the health endpoint, never a transition."""

from __future__ import annotations

from sqlalchemy import case, func, update

from airflow_txn_provider.log.models import PIPELINES
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.utils.retries import retrying


class WakerNotes(LogPart):
    """One statement each, without the pipeline's lock."""

    def report_run_trouble(self, pipeline: str, trouble: str | None) -> None:
        """Record what the pipeline's waker could not mend in Airflow (``None``: all is well
        again); the time it began is kept while the trouble lasts, for the health endpoint."""
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
        runs_to_make`), never lowering it."""
        row = PIPELINES.c
        with self.engine.begin() as conn:
            conn.execute(
                update(PIPELINES)
                .where(row.name == pipeline, row.runs_made_through < through)
                .values(runs_made_through=through)
            )
