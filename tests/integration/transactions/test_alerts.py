"""Alerts (airflow_txn_provider/log/alerts.py) on a real Postgres, through the SMTP provider's
``SmtpNotifier`` to a real SMTP server on 127.0.0.1 (aiosmtpd): one mail per alert, whoever sends
it how often; a send that fails is sent again; a stall is noticed by the health rule, alerted
once, and a commit ends it. On a real Airflow: test_credentials.py (a poison batch, then the
stall behind it)."""

from __future__ import annotations

import time

import pytest
from airflow.providers.smtp.notifications.smtp import SmtpNotifier

from airflow_txn_provider.log.alerts import (
    AlertKind,
    due_alerts,
    poisoned_alert,
    send_once,
    was_sent,
)
from airflow_txn_provider.rules.vocabulary import FailureResponse
from tests.conftest import wait_until
from tests.integration.transactions.test_transaction_log import Counter
from txn_testing.smtp import SmtpServer

PASSWORD = "Alert-S3cret-pw"


@pytest.fixture
def smtp(monkeypatch):
    with SmtpServer() as server:
        monkeypatch.setenv("AIRFLOW_CONN_ALERT_SMTP", server.connection())
        yield server


def _notifier() -> SmtpNotifier:
    return SmtpNotifier(
        to="oncall@example.org",
        from_email="airflow@example.org",
        smtp_conn_id="alert_smtp",
        subject="{{ txn_alert.subject }}",
        html_content="{{ txn_alert.message }} (txid {{ txn_alert.txid }})",
    )


class Broken:
    """A notifier whose service is down."""

    def __call__(self, context):
        raise ConnectionError("the chat service is down")


def _due(txlog, stall_after: float = 60.0):
    view = txlog.view("p")
    with txlog.engine.connect() as conn:
        return due_alerts(conn, view, stall_after)


def test_a_poison_alert_is_mailed_once_and_a_failed_send_stays_due(txlog, smtp):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    src = Counter()
    assert txlog.begin("p", 1, src).emitted
    error = f"the catalog postgresql://u:{PASSWORD}@db/cat refused it"
    txlog.fail("p", 1, 1, error=error)
    assert _due(txlog) == []  # failed, not poisoned: the sensor has not stopped at it
    txlog.record_response("p", 1, 1, FailureResponse.STOP)  # the sensor's poison batch stop
    [alert] = _due(txlog)
    assert (alert.kind, alert.key) == (AlertKind.POISONED, "txid 1 attempt 1")
    assert PASSWORD not in alert.message and "refused it" in alert.message
    with pytest.raises(ConnectionError):
        send_once(txlog.engine, alert, [_notifier(), Broken()], {})
    with txlog.engine.connect() as conn:
        assert not was_sent(conn, alert)  # rolled back: the next look finds it due again
    assert _due(txlog) == [alert]
    wait_until(lambda: len(smtp.mails()) == 1, 10, "the first notifier's mail")
    notifier = _notifier()
    assert send_once(txlog.engine, alert, [notifier], {"dag": None}) is True
    assert send_once(txlog.engine, alert, [notifier], {}) is False  # a second sender
    assert _due(txlog) == []
    # the same txid poisoned again after a person's rerun: a new alert
    assert send_once(txlog.engine, poisoned_alert("p", 1, 3, error), [notifier], {}) is True
    wait_until(lambda: len(smtp.mails()) == 3, 10, "three mails")
    time.sleep(0.5)
    mails = smtp.mails()
    assert len(mails) == 3, mails
    assert mails[1].subject == "[airflow-txn] pipeline p: poisoned at txid 1"
    assert mails[1].recipients == ("oncall@example.org",)
    assert "refused it" in mails[1].body and "(txid 1)" in mails[1].body
    assert not [m for m in mails if PASSWORD in m.body + m.subject]
    assert notifier.subject == "{{ txn_alert.subject }}"  # each send rendered a copy


def test_a_stall_is_alerted_once_and_a_commit_ends_it(txlog, smtp):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    src = Counter()
    assert txlog.begin("p", 1, src).emitted and txlog.begin("p", 2, src).emitted
    assert _due(txlog, stall_after=60) == []  # txids wait, but not for long
    [alert] = wait_until(lambda: _due(txlog, 0.5), 10, "the pipeline to stall")
    assert (alert.kind, alert.key, alert.txid) == (AlertKind.STALLED, "after txid 0", 1)
    assert "2 txid(s) wait" in alert.message and "last committed txid 0" in alert.message
    assert send_once(txlog.engine, alert, [_notifier()], {}) is True
    assert _due(txlog, 0.5) == []  # alerted: not again while it stays stalled
    txlog.mark_processed("p", 1, 1)
    txlog.commit("p", 1, 1)
    assert _due(txlog, 0.5) == []  # it moved
    [again] = wait_until(lambda: _due(txlog, 0.5), 10, "the pipeline to stall again")
    assert again.key == "after txid 1"  # a new stall, a new alert
    assert send_once(txlog.engine, again, [_notifier()], {}) is True
    wait_until(lambda: len(smtp.mails()) == 2, 10, "two mails")
    assert [m.subject for m in smtp.mails()] == [
        "[airflow-txn] pipeline p: stalled at txid 1",
        "[airflow-txn] pipeline p: stalled at txid 2",
    ]


def test_a_lease_nobody_expired_is_a_stall_alerted_once_with_its_reason(txlog, smtp, monkeypatch):
    """Its failure sensor was ended by hand: the lease runs out and nobody expires it."""
    from airflow_txn_provider.log import health

    monkeypatch.setattr(health, "STUCK_AFTER", 0.5)
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    assert txlog.begin("p", 1, Counter(), claim_timeout=0.5).emitted
    [alert] = wait_until(lambda: _due(txlog, stall_after=600), 10, "the lost lease to stall")
    assert alert.kind is AlertKind.STALLED
    assert "txid 1 attempt 1 is processing" in alert.message and "past its lease" in alert.message
    assert send_once(txlog.engine, alert, [_notifier()], {}) is True
    assert _due(txlog, stall_after=600) == []  # once
    wait_until(lambda: len(smtp.mails()) == 1, 10, "the mail")


def test_run_trouble_is_recorded_kept_since_its_start_and_cleared(txlog, monkeypatch):
    from airflow_txn_provider.log import health

    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    with txlog.engine.connect() as conn:
        assert health.read_run_trouble(conn, "p") is None
    txlog.report_run_trouble("p", "txid 1's run cannot be created: run 'm' holds its date")
    with txlog.engine.connect() as conn:
        _, since = health.read_run_trouble(conn, "p")
    time.sleep(0.2)
    txlog.report_run_trouble("p", "txid 1's run cannot be created: run 'm' (running) holds it")
    with txlog.engine.connect() as conn:
        text, again = health.read_run_trouble(conn, "p")
    assert again == since and "(running)" in text  # the trouble's start is kept while it lasts
    monkeypatch.setattr(health, "STUCK_AFTER", 0.0)
    found = wait_until(
        lambda: (h := health.read_health(txlog, "p", since)).status is health.Health.STALLED and h,
        10,
        "the trouble to stall the pipeline",
    )
    assert found.reason == text
    txlog.report_run_trouble("p", None)
    with txlog.engine.connect() as conn:
        assert health.read_run_trouble(conn, "p") is None
    assert health.read_health(txlog, "p", since).status is health.Health.IDLE
