"""One DAG run per txid, in txid order: the timetable behind every transaction DAG.

Txid ``n``'s run has run id ``txid-00000n`` and logical date ``TXID_EPOCH + (n - 1) minutes``.
A logical date makes Airflow order the grid by txid and makes "Clear → Future" mean "replay this
txid and every later one"; all of them lie in the past, so the scheduler creates them at once
(catch-up) as ``max_active_runs`` (= ``max_pending``) admits them, oldest first.

Why a timetable and not a coordinator task that triggers runs: the scheduler already creates runs
in order, admits exactly ``max_active_runs`` at a time, first in first out, and needs nothing
running when idle (DESIGN.md, measured on Airflow 3.3.2). A coordinator would re-implement that
with REST calls and a long-running task, and its runs would have no logical date unless it set
them itself. Whether a txid has data, may begin, or must wait is the begin task's business
(deferred, no worker slot), decided by the transaction log's rules.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable

TXID_EPOCH = pendulum.datetime(2000, 1, 1, tz="UTC")
TXID_STEP = timedelta(minutes=1)
RUN_ID = re.compile(r"^txid-(\d+)$")


def txid_run_id(txid: int) -> str:
    return f"txid-{txid:06d}"


def txid_from_run_id(run_id: str) -> int | None:
    """The txid of a run id ``txid-000042``, or ``None`` for any other run (a manual trigger)."""
    match = RUN_ID.match(run_id or "")
    return int(match.group(1)) if match else None


def txid_logical_date(txid: int) -> pendulum.DateTime:
    return TXID_EPOCH + TXID_STEP * (txid - 1)


def txid_of_logical_date(when: Any) -> int:
    return round((when - TXID_EPOCH).total_seconds() / TXID_STEP.total_seconds()) + 1


class TxidTimetable(Timetable):
    """Run ``n`` covers the minute ``TXID_EPOCH + (n-1) min``; its run id is ``txid-00000n``."""

    description = "one run per txid"
    can_be_scheduled = True
    run_ordering = ("logical_date",)

    @property
    def summary(self) -> str:
        return "one run per txid"

    def infer_manual_data_interval(self, *, run_after: pendulum.DateTime) -> DataInterval:
        return DataInterval.exact(run_after)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        start = (
            TXID_EPOCH if last_automated_data_interval is None else last_automated_data_interval.end
        )
        if restriction.earliest is not None and start < restriction.earliest:
            steps = (restriction.earliest - TXID_EPOCH).total_seconds() / TXID_STEP.total_seconds()
            start = TXID_EPOCH + TXID_STEP * math.ceil(steps)
        if restriction.latest is not None and start > restriction.latest:
            return None
        return DagRunInfo.interval(start, start + TXID_STEP)

    def generate_run_id(
        self, *, run_type: Any, run_after: Any, data_interval: Any, **extra: Any
    ) -> str:
        if data_interval is not None and str(getattr(run_type, "value", run_type)) == "scheduled":
            return txid_run_id(txid_of_logical_date(data_interval.start))
        return super().generate_run_id(
            run_type=run_type, run_after=run_after, data_interval=data_interval, **extra
        )
