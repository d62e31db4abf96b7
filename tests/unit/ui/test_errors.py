"""The Transactions page's errors (ui/errors.py): what a page may say of an unavailable log, and
the DAG run tab's errors naming their DAG, each kept whole across pickling."""

from __future__ import annotations

import pickle

import pytest

from airflow_txn_provider.rules.exceptions import TxnConfigError, TxnError
from airflow_txn_provider.ui.errors import (
    LOG_UNAVAILABLE,
    AccessDeniedError,
    DagAccessDeniedError,
    DagError,
    LogUnavailableError,
    UnknownDagError,
)

CAUSE = "connection 'txn_log_default': cannot reach db.internal:5432 as role txn_admin"


def test_an_unavailable_log_says_only_that_on_a_page_and_the_cause_in_the_server_log():
    err = LogUnavailableError(CAUSE)
    assert isinstance(err, TxnConfigError)
    assert str(err) == CAUSE  # the server log's
    assert err.public_message == f"{LOG_UNAVAILABLE} (see the api-server log)"
    assert "db.internal" not in err.public_message and "txn_admin" not in err.public_message


def test_advice_that_names_nothing_secret_is_on_the_page():
    advice = "the schema is at revision '9999', newer than this library"
    err = LogUnavailableError(CAUSE, advice=advice)
    assert err.public_message == f"{LOG_UNAVAILABLE}: {advice}"
    assert CAUSE not in err.public_message


@pytest.mark.parametrize("advice", [None, "run airflow_txn_provider.log.schema.upgrade(engine)"])
def test_an_unavailable_log_keeps_its_cause_and_advice_across_pickling(advice):
    again = pickle.loads(pickle.dumps(LogUnavailableError(CAUSE, advice=advice)))
    assert type(again) is LogUnavailableError
    assert (str(again), again.advice) == (CAUSE, advice)
    assert again.public_message == LogUnavailableError(CAUSE, advice=advice).public_message


@pytest.mark.parametrize("cls", [DagAccessDeniedError, UnknownDagError])
def test_a_dag_error_names_its_dag_and_keeps_it_across_pickling(cls):
    err = cls("no pipeline runs it", dag_id="txn_words")
    assert isinstance(err, DagError) and isinstance(err, TxnError)
    assert str(err) == "dag_id=txn_words: no pipeline runs it"
    assert (err.dag_id, err.detail) == ("txn_words", "no pipeline runs it")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls
    assert (str(again), again.dag_id, again.detail) == (str(err), err.dag_id, err.detail)


def test_a_pipeline_the_user_may_not_read_is_a_txn_error_naming_it():
    err = AccessDeniedError("you may not read its DAG", pipeline="words")
    assert isinstance(err, TxnError) and err.pipeline == "words"
    assert pickle.loads(pickle.dumps(err)).pipeline == "words"
