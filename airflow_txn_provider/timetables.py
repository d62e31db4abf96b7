"""The txid grid: one DAG run per txid, in txid order, dated by its txid.

Txid ``n``'s run has run id ``txid-00000n`` and logical date ``TXID_EPOCH + (n - 1) ms``, so
Airflow orders the grid by txid and "Clear → Future" means "replay this txid and every later
one". Every txid lies in the past (txid 10^9 is 2000-01-12), and a browser's dates are exact to
the millisecond, so the UI orders runs as the scheduler does. A run's ``run_after`` is real
time, when it became due. :class:`TxidTimetable` schedules a DAG's runs on this grid;
:func:`migrate_minute_runs` (``python -m airflow_txn_provider.timetables migrate-runs``) re-dates
runs of the minute grid onto it (docs/deployment.md), and until then the timetable makes no new
run for such a DAG.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
from datetime import timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable

log = logging.getLogger(__name__)

TXID_EPOCH = pendulum.datetime(2000, 1, 1, tz="UTC")
TXID_STEP = timedelta(milliseconds=1)
MINUTE_STEP = timedelta(minutes=1)
"""The step before 0.2 (see :func:`migrate_minute_runs`)."""
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
    # integer microseconds: exact for any txid (a float of seconds is not, past ~10^12)
    delta, step = when - TXID_EPOCH, TXID_STEP // timedelta(microseconds=1)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return (micros + step // 2) // step + 1


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
        last = last_automated_data_interval
        if last is not None and last.end - last.start == MINUTE_STEP:
            log.error(
                "this DAG's runs are on the minute grid of airflow-txn-provider < 0.2: no new run "
                "until they are re-dated with `python -m airflow_txn_provider.timetables "
                "migrate-runs` (docs/deployment.md)"
            )
            return None
        start = TXID_EPOCH if last is None else last.end
        if restriction.earliest is not None and start < restriction.earliest:
            steps = (restriction.earliest - TXID_EPOCH).total_seconds() / TXID_STEP.total_seconds()
            start = TXID_EPOCH + TXID_STEP * math.ceil(steps)
        if restriction.latest is not None and start > restriction.latest:
            return None
        # The logical date encodes the txid (runs stay in txid order); run_after is real time,
        # so the grid and the DAG header show when each txid's run was due, not the year 2000.
        return DagRunInfo(
            run_after=pendulum.now("UTC"), data_interval=DataInterval(start, start + TXID_STEP)
        )

    def generate_run_id(
        self, *, run_type: Any, run_after: Any, data_interval: Any, **extra: Any
    ) -> str:
        if data_interval is not None and str(getattr(run_type, "value", run_type)) == "scheduled":
            return txid_run_id(txid_of_logical_date(data_interval.start))
        return super().generate_run_id(
            run_type=run_type, run_after=run_after, data_interval=data_interval, **extra
        )


def migrate_minute_runs(
    session: Any, dag_ids: list[str] | None = None, *, chunk: int = 10_000
) -> dict[str, int]:
    """Re-date the ``txid-N`` runs of the minute grid (before 0.2) onto the millisecond grid, and
    each migrated DAG's next run after them; returns how many runs each DAG had re-dated.

    In the caller's transaction, in two passes so that no two runs share a logical date at any
    moment (``dag_run`` has a unique ``(dag_id, logical_date)``): first every such run moves far
    into the future by one shift, then each onto ``TXID_EPOCH + (txid - 1) ms``. Runs already on
    the millisecond grid, and other runs (manual, backfill), are left as they are. Idempotent.
    """
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from sqlalchemy import bindparam, select, update

    query = select(
        DagRun.id,
        DagRun.dag_id,
        DagRun.run_id,
        DagRun.logical_date,
        DagRun.data_interval_start,
        DagRun.data_interval_end,
    ).where(DagRun.run_id.like("txid-%"))
    if dag_ids:
        query = query.where(DagRun.dag_id.in_(dag_ids))
    rows = [
        row
        for row in session.execute(query)
        if row.data_interval_start is not None
        and row.data_interval_end - row.data_interval_start == MINUTE_STEP
        and txid_from_run_id(row.run_id) is not None
    ]
    # Another run of the DAG (manual, say) on a millisecond that a txid moves to: refuse, before
    # changing anything, rather than fail half-way on the unique key.
    ids = {r.id for r in rows}
    for dag_id, txid in _last_txids(rows).items():
        others = session.execute(
            select(DagRun.id, DagRun.run_id, DagRun.logical_date).where(
                DagRun.dag_id == dag_id,
                DagRun.logical_date.between(TXID_EPOCH, txid_logical_date(txid)),
            )
        )
        for clash in others:
            if clash.id in ids or clash.logical_date != txid_logical_date(
                txid_of_logical_date(clash.logical_date)
            ):
                continue  # between two milliseconds: no txid moves there
            raise RuntimeError(
                f"DAG {dag_id}: run {clash.run_id} has logical date {clash.logical_date}, where "
                f"txid {txid_of_logical_date(clash.logical_date)} is to move; delete or re-date "
                "that run first (nothing was changed)"
            )
    away = timedelta(days=365 * 1000)  # past every real run, the same for each: no collision
    moves = (
        [{"_id": r.id, "logical_date": r.logical_date + away} for r in rows],
        [
            {
                "_id": r.id,
                "logical_date": txid_logical_date(n),
                "data_interval_start": txid_logical_date(n),
                "data_interval_end": txid_logical_date(n) + TXID_STEP,
                "run_after": txid_logical_date(n) + TXID_STEP,
            }
            for r in rows
            if (n := txid_from_run_id(r.run_id)) is not None
        ],
    )
    table = DagRun.__table__
    for values in moves:
        statement = update(table).where(table.c.id == bindparam("_id"))
        for i in range(0, len(values), chunk):  # executemany, a chunk at a time
            session.connection().execute(statement, values[i : i + chunk])
    moved: dict[str, int] = {}
    for r in rows:
        moved[r.dag_id] = moved.get(r.dag_id, 0) + 1
    for dag_id, txid in _last_txids(rows).items():
        start = txid_logical_date(txid + 1)
        session.execute(
            update(DagModel)
            .where(DagModel.dag_id == dag_id)
            .values(
                next_dagrun=start,
                next_dagrun_data_interval_start=start,
                next_dagrun_data_interval_end=start + TXID_STEP,
                next_dagrun_create_after=start + TXID_STEP,
            )
        )
    return moved


def _last_txids(rows: Any) -> dict[str, int]:
    last: dict[str, int] = {}
    for r in rows:
        last[r.dag_id] = max(last.get(r.dag_id, 0), txid_from_run_id(r.run_id) or 0)
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_txn_provider.timetables")
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser(
        "migrate-runs",
        help="re-date the runs of transaction DAGs made before 0.2 (one txid a minute) onto "
        "the millisecond grid; pause those DAGs first",
    )
    migrate.add_argument("--dag-id", action="append", help="only this DAG (repeatable)")
    args = parser.parse_args(argv)
    from airflow.utils.session import create_session

    with create_session() as session:
        moved = migrate_minute_runs(session, args.dag_id)
    for dag_id, count in sorted(moved.items()):
        print(f"{dag_id}: {count} runs re-dated onto the millisecond grid")
    if not moved:
        print("no run on the minute grid: nothing to do")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
