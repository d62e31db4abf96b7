"""Alerts: the pipeline's notifiers told, once, when a person is needed.

``TxnPipeline(alert_notifiers=[...])`` takes Airflow notifiers (``BaseNotifier``), called with the
task's context plus ``txn_alert`` (:meth:`Alert.as_context`) for two events: **poisoned**, once
per poisoned attempt, sent by the failure sensor as it stops the pipeline; **stalled**, once per
stall (nothing moved for ``stall_alert_after`` seconds, by the rule of
:func:`~airflow_txn_provider.log.health.health_of`). What is due and unsent is found every
``ALERT_CHECK_EVERY`` seconds (:func:`due_alerts`) by the failure sensor's trigger of the oldest
uncommitted txid, which wakes its sensor to send it. Each alert is recorded in ``txn_alert`` in
the database transaction that sends it: a second sender sends nothing, a failed send rolls its
record back and the next wake sends it again. At least once, never lost.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import exists, select, tuple_
from sqlalchemy.dialects.postgresql import insert

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.log.health import Health, PipelineHealth, health_from_log
from airflow_txn_provider.log.models import ALERTS, ATTEMPTS
from airflow_txn_provider.rules.vocabulary import FailureResponse, TxStatus
from airflow_txn_provider.utils.redaction import redact

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.engine import Engine

    from airflow_txn_provider.rules.records import PipelineView

log = logging.getLogger(__name__)

ALERT_CHECK_EVERY = 10.0
"""Seconds between two looks of the oldest txid's watch for a due alert (one extra query)."""


class AlertKind(StrEnum):
    POISONED = "poisoned"
    STALLED = "stalled"


@dataclass(frozen=True)
class Alert:
    pipeline: str
    kind: AlertKind
    key: str
    """What the alert is about, unique per pipeline and kind: it is sent once per key."""
    txid: int
    attempt: int | None
    message: str

    @property
    def subject(self) -> str:
        return f"[airflow-txn] pipeline {self.pipeline}: {self.kind.value} at txid {self.txid}"

    def as_context(self) -> dict[str, Any]:
        """What a notifier's templates read as ``txn_alert``."""
        return {
            "pipeline": self.pipeline,
            "kind": self.kind.value,
            "txid": self.txid,
            "attempt": self.attempt,
            "subject": self.subject,
            "message": self.message,
        }


def poisoned_alert(pipeline: str, txid: int, attempt: int, last_error: str | None) -> Alert:
    """The alert for poisoned ``(txid, attempt)``, whose last error was ``last_error``."""
    return Alert(
        pipeline,
        AlertKind.POISONED,
        f"txid {txid} attempt {attempt}",
        txid,
        attempt,
        redact(
            f"POISON BATCH, pipeline={pipeline} stopped at txid {txid} (attempt {attempt}): "
            f"{last_error or '(no error recorded)'}. Later txids wait for it: fix the cause, "
            "then Clear its run in the Airflow UI"
        ),
    )


def stalled_alert(health: PipelineHealth) -> Alert:
    """The alert for a stalled pipeline: one per last committed txid (a commit ends a stall)."""
    waiting = health.newest_txid - health.last_committed
    failed = (
        f"; txid {health.oldest_failed} failed and waits for a replay"
        if health.oldest_failed is not None
        else ""
    )
    return Alert(
        health.pipeline,
        AlertKind.STALLED,
        f"after txid {health.last_committed}",
        health.last_committed + 1,
        None,
        f"pipeline={health.pipeline} stalled: {waiting} txid(s) wait and nothing has moved for "
        f"{health.stalled_for or 0:.0f} s (last committed txid {health.last_committed}){failed}"
        + (f": {health.reason}" if health.reason else ""),
    )


def due_alerts(conn: Connection, view: PipelineView, stall_after: float) -> list[Alert]:
    """The alerts of ``view``'s pipeline that are due and were not sent: each txid in flight
    whose current attempt the failure sensor stopped at (poisoned), and a stall."""
    if not view.in_flight or view.now is None:
        return []
    alerts = []
    current = [(r.txid, r.attempt) for r in view.in_flight if r.status is TxStatus.FAILED]
    if current:
        a = ATTEMPTS.c
        stopped = conn.execute(
            select(a.txid, a.attempt, a.error).where(
                (a.pipeline == view.pipeline)
                & tuple_(a.txid, a.attempt).in_(current)
                & (a.response == FailureResponse.STOP)
            )
        ).all()
        alerts += [poisoned_alert(view.pipeline, t, n, error) for t, n, error in stopped]
    health = health_from_log(conn, view, view.now, stall_after)
    if health.status is Health.STALLED:
        alerts.append(stalled_alert(health))
    return [alert for alert in alerts if not was_sent(conn, alert)]


def was_sent(conn: Connection, alert: Alert) -> bool:
    row = ALERTS.c
    return bool(
        conn.execute(
            select(
                exists().where(
                    (row.pipeline == alert.pipeline)
                    & (row.kind == alert.kind.value)
                    & (row.key == alert.key)
                )
            )
        ).scalar_one()
    )


def send_once(
    engine: Engine, alert: Alert, notifiers: Sequence[Any], context: Mapping[str, Any]
) -> bool:
    """Send ``alert`` to every notifier unless it was sent already; whether it was sent now.

    Recorded and sent in one database transaction: a notifier that raises rolls the record back
    (the error propagates; the next wake sends again)."""
    if not notifiers:
        return False
    with engine.begin() as conn:
        recorded = conn.execute(
            insert(ALERTS)
            .values(
                pipeline=alert.pipeline,
                kind=alert.kind.value,
                key=alert.key,
                message=alert.message,
            )
            .on_conflict_do_nothing()
            .returning(ALERTS.c.key)
        ).first()
        if recorded is None:
            log.info(
                "pipeline=%s: %s alert (%s) sent already", alert.pipeline, alert.kind, alert.key
            )
            return False
        for notifier in notifiers:
            # a notifier renders its templates into itself: each alert gets a fresh copy
            copy.deepcopy(notifier)({**context, "txn_alert": alert.as_context()})
    log.warning("pipeline=%s: %s alert sent: %s", alert.pipeline, alert.kind, alert.message)
    return True


__all__ = [
    "Alert",
    "AlertKind",
    "due_alerts",
    "poisoned_alert",
    "send_once",
    "stalled_alert",
    "was_sent",
]
