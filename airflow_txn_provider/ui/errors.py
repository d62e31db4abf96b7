"""Errors of the Transactions page, each mapped to one HTTP status by the app.

The log's own errors keep their meaning: :class:`~airflow_txn_provider.rules.exceptions.
UnknownPipelineError` is a 404 naming the pipeline. These two are the page's own: the log cannot
be opened (503: the page says :data:`LOG_UNAVAILABLE`, the server log says why) and the user may
not read a pipeline's DAG (403). The DAG run tab is keyed by a DAG id, not a pipeline: its errors
(:class:`DagError`) name the DAG.
"""

from __future__ import annotations

from functools import partial

from airflow_txn_provider.rules.exceptions import TxnConfigError, TxnError

LOG_UNAVAILABLE = "the transaction log is unavailable"
"""What a 503 says, whatever the cause: the cause may name the database's host and role."""
READ_FAILED = "reading the transaction log failed (see the api-server log)"
"""What a 500 says."""


class LogUnavailableError(TxnConfigError):
    """The transaction log cannot be opened or reached: the connection is missing, the database
    is down, or its schema does not match this library.

    The message says which connection and what went wrong, which may name the database's host,
    role and the driver's words: it is for the server log only. A page shows
    :attr:`public_message`: :data:`LOG_UNAVAILABLE`, and ``advice`` where there is advice that
    names nothing secret (a schema of another version: the revisions and what to upgrade).
    """

    def __init__(self, message: str, *, advice: str | None = None) -> None:
        super().__init__(message)
        self.advice = advice

    def __reduce__(self):  # TxnError's would drop advice
        return (partial(type(self), advice=self.advice), (self.detail,))

    @property
    def public_message(self) -> str:
        if self.advice:
            return f"{LOG_UNAVAILABLE}: {self.advice}"
        return f"{LOG_UNAVAILABLE} (see the api-server log)"


class AccessDeniedError(TxnError):
    """The user may not read the DAG of this pipeline (Airflow's auth manager said no)."""


class DagError(TxnError):
    """An error about an Airflow DAG (the DAG run tab's address names a DAG, not a pipeline)."""

    def __init__(self, message: str, *, dag_id: str) -> None:
        self.dag_id = dag_id
        super().__init__(f"dag_id={dag_id}: {message}")
        self.detail = message

    def __reduce__(self):  # TxnError's would drop dag_id, a required keyword
        return (partial(type(self), dag_id=self.dag_id), (self.detail,))


class DagAccessDeniedError(DagError):
    """The user may not read this DAG (Airflow's auth manager said no), so its runs' tab is
    refused whatever pipeline the DAG runs."""


class UnknownDagError(DagError):
    """The log records no pipeline run by this DAG (its ``begin`` task has not run yet, or it is
    no transaction DAG) and no pipeline the user may read is named like it."""


class UnknownStateError(TxnError):
    """The pipeline has no state of this name (a state's past is asked by its name): a 404."""

    fields = ("state",)
    state: str | None


class StateKeyError(TxnError):
    """What was typed as a state's key does not fit its key columns (how many, of which type):
    a 422 that says what the state's key is."""

    fields = ("state",)
    state: str | None
