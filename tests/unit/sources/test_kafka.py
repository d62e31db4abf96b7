"""The Kafka sources' Airflow side (a txid's offsets from the partitions' watermarks) and their
connection settings, with the watermarks given: no cluster. The integration tests
(tests/integration/sources/test_kafka.py) read real batches from a Kafka wire-protocol cluster."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_txn_provider.rules.exceptions import (
    OffsetsDeletedError,
    OffsetsWentBackError,
    TxnConfigError,
)
from airflow_txn_provider.rules.vocabulary import SourceKind
from airflow_txn_provider.sources.base import source_from_spec
from airflow_txn_provider.sources.kafka import (
    SKIPPED,
    KafkaSource,
    OpaqueKafkaSource,
    partition_key,
    split_key,
)
from airflow_txn_provider.utils import credentials, redaction
from tests.unit.sources.kafka_given import given_topic

SECRET = "k4fka-S3cret"


def _with_marks(cls, marks, **kw):
    """A source of ``cls`` whose topic's watermarks are ``marks`` ({key: (earliest, latest)})."""
    return given_topic(cls, marks, **kw)


@pytest.mark.parametrize("cls", [KafkaSource, OpaqueKafkaSource])
def test_a_first_txid_takes_each_partition_from_its_earliest_record_capped(cls):
    source = _with_marks(
        cls, {"words-0": (0, 5), "words-1": (3, 40), "words-2": (7, 7)}, max_per_partition=10
    )
    assert source.initialize_transaction(1, None) == {
        "words-0": [0, 5],
        "words-1": [3, 13],
        "words-2": [7, 7],
    }


def test_the_next_txid_continues_where_the_previous_ended_and_picks_up_new_partitions():
    source = _with_marks(KafkaSource, {"words-0": (0, 9), "words-1": (0, 4), "words-2": (2, 6)})
    prev = {"words-0": [0, 5], "words-1": [0, 4]}  # words-2 is new since then
    assert source.initialize_transaction(2, prev) == {
        "words-0": [5, 9],
        "words-1": [4, 4],
        "words-2": [2, 6],
    }


def test_no_new_record_is_no_batch_yet():
    source = _with_marks(KafkaSource, {"words-0": (0, 5)})
    assert source.initialize_transaction(3, {"words-0": [2, 5]}) is None


def test_a_partition_unavailable_now_keeps_its_position():
    source = _with_marks(KafkaSource, {"words-0": (0, 8)})
    assert source.initialize_transaction(2, {"words-0": [0, 5], "words-1": [0, 3]}) == {
        "words-0": [5, 8],
        "words-1": [3, 3],
    }


def test_a_partition_that_went_back_is_refused():
    source = _with_marks(KafkaSource, {"words-0": (0, 2)})
    with pytest.raises(OffsetsWentBackError):
        source.initialize_transaction(2, {"words-0": [0, 5]})


def test_records_deleted_before_a_transactional_txid_read_them_stop_it():
    source = _with_marks(KafkaSource, {"words-0": (20, 30), "words-1": (0, 4)})
    with pytest.raises(OffsetsDeletedError) as raised:
        source.initialize_transaction(4, {"words-0": [5, 10], "words-1": [0, 2]})
    err = raised.value
    assert (err.txid, err.partition) == (4, "words-0")
    assert "[10, 20)" in str(err) and "OpaqueKafkaSource" in str(err)


def test_an_opaque_source_skips_deleted_records_and_says_so(caplog):
    source = _with_marks(OpaqueKafkaSource, {"words-0": (20, 30), "words-1": (0, 4)})
    with caplog.at_level(logging.WARNING):
        metadata = source.initialize_transaction(4, {"words-0": [5, 10], "words-1": [0, 2]})
    # the txid notes the offsets it skipped, beside the ones it reads
    assert metadata == {"words-0": [20, 30], "words-1": [2, 4], SKIPPED: {"words-0": [10, 20]}}
    assert "txid=4 Kafka partition words-0: offsets [10, 20)" in caplog.text
    assert "10 records lost" in caplog.text
    # the next txid continues from the ranges, not from the note
    source = _with_marks(OpaqueKafkaSource, {"words-0": (20, 35), "words-1": (0, 4)})
    assert source.initialize_transaction(5, metadata) == {"words-0": [30, 35], "words-1": [4, 4]}


def test_a_txid_that_skips_nothing_carries_no_note():
    source = _with_marks(OpaqueKafkaSource, {"words-0": (0, 30)})
    assert SKIPPED not in source.initialize_transaction(2, {"words-0": [5, 10]})


def test_kinds_and_keys():
    assert KafkaSource("t").kind is SourceKind.TRANSACTIONAL
    assert OpaqueKafkaSource("t").kind is SourceKind.OPAQUE
    assert partition_key("my-topic.v2", 11) == "my-topic.v2-11"
    assert split_key("my-topic.v2-11") == ("my-topic.v2", 11)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topic": ""}, "topic"),
        ({"topic": "t", "max_per_partition": 0}, "max_per_partition"),
        ({"topic": "t", "reader": "jdbc"}, "reader"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KafkaSource(**kwargs)


def test_a_spec_carries_the_connection_id_and_no_setting():
    source = OpaqueKafkaSource("words", kafka_conn_id="events", max_per_partition=7)
    spec = source.to_spec()
    assert source_from_spec(json.dumps(spec)) == source
    assert set(spec["args"]) == {
        "topic",
        "kafka_conn_id",
        "max_per_partition",
        "reader",
        "read_timeout",
        "request_timeout",
        "reset_log_from_txid",
    }


class TestKafkaConfig:
    @pytest.fixture(autouse=True)
    def _fresh_registry(self, monkeypatch):
        monkeypatch.setattr(redaction, "_secrets", set())

    def test_from_an_airflow_connection_of_type_kafka_with_its_secrets_registered(
        self, monkeypatch
    ):
        extra = {
            "bootstrap.servers": "127.0.0.1:9092",
            "security.protocol": "SASL_SSL",
            "sasl.username": "reader",
            "sasl.password": SECRET,
        }
        monkeypatch.setenv(
            "AIRFLOW_CONN_EVENTS", json.dumps({"conn_type": "kafka", "extra": extra})
        )
        assert credentials.kafka_config("events") == extra
        assert SECRET not in redaction.redact(f"login failed for reader:{SECRET}")

    def test_a_driver_reads_what_its_task_handed_it(self, monkeypatch):
        config = {"bootstrap.servers": "127.0.0.1:9093", "sasl.password": SECRET}
        monkeypatch.setenv(
            "AIRFLOW_CONN_EVENTS", json.dumps({"conn_type": "kafka", "extra": config})
        )
        env = credentials.kafka_connection_env(["events", "events"])
        assert list(env) == ["TXN_CONN_KAFKA__EVENTS"]
        monkeypatch.delenv("AIRFLOW_CONN_EVENTS")
        monkeypatch.setenv("TXN_CONN_KAFKA__EVENTS", env["TXN_CONN_KAFKA__EVENTS"])
        assert credentials.kafka_config("events") == config
        assert SECRET not in redaction.redact(SECRET)

    def test_the_driver_env_of_a_source_is_its_connection(self, monkeypatch):
        monkeypatch.setenv(
            "AIRFLOW_CONN_EVENTS",
            json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:1"}}),
        )
        env = KafkaSource("t", kafka_conn_id="events").driver_env()
        assert json.loads(env["TXN_CONN_KAFKA__EVENTS"]) == {"bootstrap.servers": "127.0.0.1:1"}

    def test_a_missing_connection_says_what_to_create(self, monkeypatch):
        monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
        with pytest.raises(TxnConfigError, match=r"'nowhere' .*type kafka.*bootstrap\.servers"):
            credentials.kafka_config("nowhere")

    def test_a_connection_without_bootstrap_servers_is_refused(self, monkeypatch):
        monkeypatch.setenv(
            "AIRFLOW_CONN_EVENTS", json.dumps({"conn_type": "kafka", "extra": {"acks": "all"}})
        )
        with pytest.raises(TxnConfigError, match=r"no bootstrap\.servers"):
            credentials.kafka_config("events")
