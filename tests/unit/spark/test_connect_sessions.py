"""The pure parts of spark/connect_sessions.py: ids, URLs, lock keys."""

from __future__ import annotations

import uuid

import pytest

from airflow_txn_provider.spark.connect_sessions import (
    ROTATION_SECONDS,
    SLOTS,
    _slot_key,
    is_session_closed,
    slot_session_id,
    with_session_id,
)


def test_a_slots_id_is_stable_within_a_period_and_changes_with_everything_else():
    at = 10 * ROTATION_SECONDS + 5
    one = slot_session_id("p", "sc://h:1", 0, 0, at)
    assert uuid.UUID(one)  # the server accepts only UUIDs
    assert one == slot_session_id("p", "sc://h:1", 0, 0, at + ROTATION_SECONDS - 10)
    others = {
        slot_session_id("p", "sc://h:1", 0, 0, at + ROTATION_SECONDS),
        slot_session_id("p", "sc://h:1", 0, 1, at),
        slot_session_id("p", "sc://h:1", 1, 0, at),
        slot_session_id("q", "sc://h:1", 0, 0, at),
        slot_session_id("p", "sc://h:2", 0, 0, at),
    }
    assert one not in others and len(others) == 5


def test_the_session_id_joins_the_urls_parameters():
    assert with_session_id("sc://h:1", "abc") == "sc://h:1/;session_id=abc"
    # what the Spark provider's SparkConnectHook builds from a connection
    assert with_session_id("sc://h:1/", "abc") == "sc://h:1/;session_id=abc"
    assert with_session_id("sc://h:1/;token=t", "abc") == "sc://h:1/;token=t;session_id=abc"
    assert with_session_id("sc://h:1/;token=t;use_ssl=true", "abc") == (
        "sc://h:1/;token=t;use_ssl=true;session_id=abc"
    )
    assert with_session_id("sc://h:1/;session_id=old;x=1", "abc") == "sc://h:1/;x=1;session_id=abc"


def test_slot_keys_are_int4_and_a_pipelines_slots_distinct():
    keys = {_slot_key("pipeline", n) for n in range(SLOTS)}
    assert len(keys) == SLOTS
    assert all(0 <= k < 2**31 for k in keys)


def test_a_closed_session_is_recognised_by_its_condition():
    class Closed(Exception):
        def getCondition(self):
            return "INVALID_HANDLE.SESSION_CLOSED"

    assert is_session_closed(Closed("handle invalid"))
    assert not is_session_closed(ConnectionError("connection refused"))


def test_the_connect_runner_refuses_pyspark_3_5_with_a_typed_error(monkeypatch):
    from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
    from airflow_txn_provider.rules.exceptions import TxnConfigError

    monkeypatch.setattr("airflow_txn_provider.operators.spark_runner.SUPPORTS_CONNECT", False)
    monkeypatch.setattr("airflow_txn_provider.operators.spark_runner.PYSPARK_VERSION", "3.5.9")
    with pytest.raises(TxnConfigError, match=r"'spark_connect_default'.*PySpark 4.0 .*3\.5\.9"):
        SparkConnectRunner(lambda batch: batch)


def test_a_bad_url_fails_at_once_instead_of_waiting_for_a_server():
    import time

    from pyspark.sql import SparkSession

    from airflow_txn_provider.compat.spark import SUPPORTS_CONNECT
    from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
    from airflow_txn_provider.spark.connect_sessions import keep_classic_mode

    if not SUPPORTS_CONNECT:
        pytest.skip("Spark Connect: PySpark 4.0 and later")

    runner = SparkConnectRunner(
        lambda batch: batch, url="sc://127.0.0.1:1//bad", connect_timeout=60
    )
    started = time.monotonic()
    with keep_classic_mode(), pytest.raises(ValueError, match="INVALID_CONNECT_URL"):
        runner._connect(SparkSession, runner.connection_url(), None)
    assert time.monotonic() - started < 10  # not retried as if the server were restarting
