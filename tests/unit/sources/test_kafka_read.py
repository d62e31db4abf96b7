"""Reading Kafka offset ranges (sources/kafka_read.py): the consumer's settings, with no cluster."""

from __future__ import annotations

from airflow_txn_provider.sources.kafka_read import consumer_settings


def test_the_reader_joins_no_group_commits_nothing_and_never_jumps():
    settings = consumer_settings({"bootstrap.servers": "b:1", "enable.auto.commit": True})
    assert settings["enable.auto.commit"] is False
    assert settings["enable.auto.offset.store"] is False
    assert settings["auto.offset.reset"] == "error"
    assert settings["isolation.level"] == "read_committed"
    assert settings["bootstrap.servers"] == "b:1"
