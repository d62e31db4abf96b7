"""The provider's metrics go through Airflow's Stats, each twice: tagged by pipeline, and with the
pipeline in the name for plain StatsD; a backend that fails never fails what is measured."""

from __future__ import annotations

import os

import pytest

from airflow_txn_provider.utils import metrics

# The task SDK's Stats (Airflow 3.2 and later); 3.1's is the core's (compat/airflow.py).
stats_backend = pytest.importorskip("airflow.sdk._shared.observability.metrics.stats")
stats = pytest.importorskip("airflow.sdk.observability.stats")


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, dict | None]] = []

    def __getattr__(self, kind):
        def send(stat, value=None, *args, tags=None, count=None, **kwargs):
            self.sent.append((kind, stat, count if value is None else value, tags))

        return send


@pytest.fixture
def backend(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(metrics, "_initialized_in", os.getpid())  # set up: by this test
    monkeypatch.setattr(metrics, "_client", stats)
    monkeypatch.setattr(stats_backend, "_backend", recorder)
    monkeypatch.setattr(stats_backend, "_export_legacy_names", False)
    return recorder


def test_each_metric_is_sent_tagged_and_named_by_pipeline(backend):
    metrics.gauge(metrics.LAST_COMMITTED, "orders", 42)
    metrics.incr(metrics.RETRIES, "orders", kind="OperationalError")
    metrics.timing(metrics.PROCESSING_DURATION, "orders", 1.5, job="word_count:transform:12")
    assert backend.sent == [
        ("gauge", "txn.last_committed_txid", 42, {"pipeline": "orders"}),
        ("gauge", "txn.last_committed_txid.orders", 42, None),
        ("incr", "txn.retries", 1, {"pipeline": "orders", "kind": "OperationalError"}),
        ("incr", "txn.retries.orders.OperationalError", 1, None),
        (
            "timing",
            "txn.processing.duration",
            1500.0,
            {"pipeline": "orders", "job": "word_count:transform:12"},
        ),
        ("timing", "txn.processing.duration.orders.word_count_transform_12", 1500.0, None),
    ]


def test_nothing_is_counted_for_zero_and_a_failing_backend_is_harmless(backend, monkeypatch):
    metrics.incr(metrics.STAGED_ROWS, "orders", 0)
    assert backend.sent == []

    def broken(*args, **kwargs):
        raise OSError("statsd host unreachable")

    monkeypatch.setattr(stats, "gauge", broken)
    metrics.gauge(metrics.LAG_BEGUN, "orders", 3)  # no exception


def test_every_name_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "airflow.md").read_text()
    for name in metrics.ALL:
        assert f"`txn.{name}`" in doc, name


def test_stats_are_set_up_from_the_metrics_configuration(monkeypatch):
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setattr(metrics, "_initialized_in", None)
    monkeypatch.setattr(stats_backend, "_backend", None)
    metrics.gauge(metrics.LAG_BEGUN, "orders", 1)  # nothing configured: nothing sent, no error
    assert metrics._initialized_in == os.getpid()
    assert type(stats_backend._get_backend()).__name__ == "NoStatsLogger"
