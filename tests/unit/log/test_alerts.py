"""The alerts' keys and messages (airflow_txn_provider/log/alerts.py); sending, once, on a real
Postgres and SMTP server: tests/integration/transactions/test_alerts.py."""

from __future__ import annotations

from airflow_txn_provider.log.alerts import AlertKind, poisoned_alert, stalled_alert
from airflow_txn_provider.log.health import Health, PipelineHealth


def _health(**kw):
    fields = dict(
        pipeline="orders",
        status=Health.STALLED,
        last_committed=41,
        newest_txid=44,
        lag_processed=1,
        lag_begun=3,
        last_commit_age=700.0,
        stalled_for=650.4,
        oldest_failed=None,
    )
    return PipelineHealth(**{**fields, **kw})


def test_a_poison_alert_is_keyed_by_its_attempt_and_carries_the_error_without_passwords():
    alert = poisoned_alert("orders", 42, 3, "the catalog postgresql://u:hunter2pw@db/x refused")
    assert (alert.kind, alert.key, alert.txid, alert.attempt) == (
        AlertKind.POISONED,
        "txid 42 attempt 3",
        42,
        3,
    )
    assert alert.message.startswith(
        "POISON BATCH, pipeline=orders stopped at txid 42 (attempt 3): the catalog "
    )
    assert "hunter2pw" not in alert.message and "refused" in alert.message
    assert alert.message.endswith("fix the cause, then Clear its run in the Airflow UI")
    assert alert.subject == "[airflow-txn] pipeline orders: poisoned at txid 42"
    assert poisoned_alert("orders", 42, 4, "x").key != alert.key  # poisoned again: a new alert
    assert "(no error recorded)" in poisoned_alert("orders", 42, 3, None).message
    assert alert.as_context() == {
        "pipeline": "orders",
        "kind": "poisoned",
        "txid": 42,
        "attempt": 3,
        "subject": alert.subject,
        "message": alert.message,
    }


def test_a_stall_is_keyed_by_the_last_committed_txid_and_says_what_waits():
    alert = stalled_alert(_health())
    assert (alert.kind, alert.key, alert.txid, alert.attempt) == (
        AlertKind.STALLED,
        "after txid 41",
        42,
        None,
    )
    assert alert.message == (
        "pipeline=orders stalled: 3 txid(s) wait and nothing has moved for 650 s "
        "(last committed txid 41)"
    )
    failed = stalled_alert(_health(oldest_failed=42))
    assert failed.message.endswith("; txid 42 failed and waits for a replay")
    assert stalled_alert(_health(last_committed=44, newest_txid=45)).key == "after txid 44"
