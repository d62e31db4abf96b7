"""Errors of the Transactions page, each mapped to one HTTP status by the app.

The log's own errors keep their meaning: :class:`~airflow_txn_provider.exceptions.
UnknownPipelineError` is a 404 naming the pipeline. These two are the page's own: the log cannot
be opened (503, saying what to configure) and the user may not read a pipeline's DAG (403).
"""

from __future__ import annotations

from airflow_txn_provider.exceptions import TxnConfigError, TxnError


class LogUnavailableError(TxnConfigError):
    """The transaction log cannot be opened or reached: the connection is missing, the database
    is down, or its schema is behind. The message says which connection and what to set."""


class AccessDeniedError(TxnError):
    """The user may not read the DAG of this pipeline (Airflow's auth manager said no)."""
