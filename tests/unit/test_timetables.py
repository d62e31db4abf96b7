"""The txid timetable: txid run ids and logical dates, one run per txid in txid order."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pendulum
from airflow.timetables.base import TimeRestriction

from airflow_txn_provider.timetables import (
    MINUTE_STEP,
    TXID_EPOCH,
    TXID_STEP,
    TxidTimetable,
    txid_from_run_id,
    txid_logical_date,
    txid_of_logical_date,
    txid_run_id,
)


def test_timetable_runs_are_txids_in_order():
    timetable = TxidTimetable()
    restriction = TimeRestriction(earliest=TXID_EPOCH, latest=None, catchup=True)
    info = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    runs = []
    for _ in range(3):
        runs.append(
            timetable.generate_run_id(
                run_type="scheduled", run_after=info.run_after, data_interval=info.data_interval
            )
        )
        info = timetable.next_dagrun_info(
            last_automated_data_interval=info.data_interval, restriction=restriction
        )
    assert runs == ["txid-000001", "txid-000002", "txid-000003"]
    assert info.logical_date == txid_logical_date(4) < pendulum.now("UTC")
    assert txid_of_logical_date(txid_logical_date(42)) == 42
    assert txid_from_run_id(txid_run_id(42)) == 42
    assert txid_from_run_id("manual__2026-01-01T00:00:00") is None


def test_a_runs_logical_date_is_its_txid_and_its_run_after_the_time_it_is_due():
    """The grid and the DAG header show run_after: today, not the txid-encoding year 2000."""
    restriction = TimeRestriction(earliest=TXID_EPOCH, latest=None, catchup=True)
    before = pendulum.now("UTC")
    info = TxidTimetable().next_dagrun_info(
        last_automated_data_interval=None, restriction=restriction
    )
    assert before <= info.run_after <= pendulum.now("UTC")
    assert info.logical_date == txid_logical_date(1) and info.run_after.tzinfo is not None


def test_txid_a_billion_is_schedulable_at_once():
    """No calendar cap: the run after txid 10^9 - 1 is txid 10^9, due now (long past)."""
    timetable = TxidTimetable()  # a DAG built before the waker (runs created by the scheduler)
    restriction = TimeRestriction(earliest=TXID_EPOCH, latest=None, catchup=True)
    before = timetable.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
    last = type(before.data_interval)(
        txid_logical_date(10**9 - 1), txid_logical_date(10**9 - 1) + TXID_STEP
    )
    info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
    assert info.logical_date == txid_logical_date(10**9) < pendulum.now("UTC")
    assert info.run_after <= pendulum.now("UTC")
    run_id = timetable.generate_run_id(
        run_type="scheduled", run_after=info.run_after, data_interval=info.data_interval
    )
    assert run_id == "txid-1000000000" and txid_from_run_id(run_id) == 10**9


@hypothesis.given(st.lists(st.integers(1, 10**13), min_size=2, max_size=50, unique=True))
def test_logical_dates_order_runs_by_txid_exactly(txids):
    dates = [txid_logical_date(t) for t in txids]
    assert sorted(dates) == [txid_logical_date(t) for t in sorted(txids)]
    assert [txid_of_logical_date(d) for d in dates] == txids
    # a browser's dates are exact to the millisecond: each txid has a millisecond of its own
    assert len({d.isoformat(timespec="milliseconds") for d in dates}) == len(txids)


def test_a_dag_still_on_the_minute_grid_gets_no_new_run_until_migrated(caplog):
    restriction = TimeRestriction(earliest=TXID_EPOCH, latest=None, catchup=True)
    minute_run = type(
        TxidTimetable()
        .next_dagrun_info(last_automated_data_interval=None, restriction=restriction)
        .data_interval
    )(TXID_EPOCH + MINUTE_STEP * 4, TXID_EPOCH + MINUTE_STEP * 5)
    info = TxidTimetable().next_dagrun_info(
        last_automated_data_interval=minute_run, restriction=restriction
    )
    assert info is None
    assert "migrate-runs" in caplog.text
