"""Pipelines from before 0.2 (one txid a minute) migrate onto the millisecond grid: their runs
are re-dated in Airflow's real metadata database (Postgres, migrated by ``airflow db migrate``)
by the command a deployment runs, and the timetable then continues after the last txid."""

from __future__ import annotations

import subprocess
import sys

import pendulum
import pytest
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel
from airflow.timetables.base import DataInterval, TimeRestriction
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from airflow_txn_provider.timetables import (
    MINUTE_STEP,
    TXID_EPOCH,
    TXID_STEP,
    TxidTimetable,
    txid_logical_date,
    txid_run_id,
)
from tests.conftest import new_database
from txn_testing.airflow import AirflowStack

pytestmark = pytest.mark.scenario  # make test-scenarios: 70 000 legacy runs in Airflow's database

LEGACY_TXIDS = 70_000  # past 60 001: a minute-grid date collides with a millisecond-grid one


def test_minute_grid_runs_are_redated_in_order_and_the_dag_continues(postgres, tmp_path):
    meta = new_database(postgres, migrated=False)
    stack = AirflowStack(tmp_path / "airflow", meta, tmp_path / "dags")
    (tmp_path / "dags").mkdir()
    stack.airflow("db", "migrate")
    engine = create_engine(meta)
    minute = lambda t: TXID_EPOCH + MINUTE_STEP * (t - 1)  # noqa: E731 (the old grid)
    with Session(engine) as session, session.begin():
        session.add(DagBundleModel(name="b"))
        session.flush()
        for dag_id in ("old_words", "other"):
            session.add(
                DagModel(
                    dag_id=dag_id,
                    bundle_name="b",
                    fileloc="/dags/x.py",
                    max_active_tasks=16,
                    max_active_runs=4,
                    max_consecutive_failed_dag_runs=0,
                    has_task_concurrency_limits=False,
                )
            )
    with engine.begin() as conn:
        runs = [
            {"d": "old_words", "r": txid_run_id(t), "s": minute(t), "e": minute(t + 1)}
            for t in range(1, LEGACY_TXIDS + 1)
        ]
        # a manual run, and another DAG's run already on the new grid: both left alone
        manual_at = pendulum.datetime(2026, 1, 1, tz="UTC")
        runs.append({"d": "old_words", "r": "manual__x", "s": manual_at, "e": manual_at})
        runs.append(
            {
                "d": "other",
                "r": txid_run_id(5),
                "s": txid_logical_date(5),
                "e": txid_logical_date(5) + TXID_STEP,
            }
        )
        conn.execute(
            text(
                "INSERT INTO dag_run (dag_id, run_id, logical_date, data_interval_start, "
                "data_interval_end, run_after, run_type, state, clear_number, span_status) "
                "VALUES (:d, :r, :s, :s, :e, :e, 'scheduled', 'success', 0, 'not_started')"
            ),
            runs,
        )

    def migrate(ok: bool = True) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "airflow_txn_provider.timetables", "migrate-runs"],
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if not ok:
            assert done.returncode != 0
            return done.stderr
        assert done.returncode == 0, [e[:400] for e in done.stderr.splitlines() if "rror" in e]
        return done.stdout

    # a run where a txid must move: refused, nothing changed
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO dag_run (dag_id, run_id, logical_date, run_after, run_type, state, "
                "clear_number, span_status) VALUES ('old_words', 'manual__clash', :s, :s, "
                "'manual', 'success', 0, 'not_started')"
            ),
            {"s": txid_logical_date(60_002)},
        )
    refused = migrate(ok=False)
    assert (
        "manual__clash" in refused and "txid 60002" in refused and "nothing was changed" in refused
    )
    with engine.begin() as conn:
        assert conn.execute(
            text("SELECT logical_date FROM dag_run WHERE run_id = 'txid-000002'")
        ).scalar_one() == minute(2)
        conn.execute(text("DELETE FROM dag_run WHERE run_id = 'manual__clash'"))

    assert f"old_words: {LEGACY_TXIDS} runs re-dated" in migrate()
    assert "nothing to do" in migrate()  # idempotent

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT dag_id, run_id, logical_date, data_interval_start, data_interval_end, "
                "run_after FROM dag_run ORDER BY dag_id, logical_date"
            )
        ).all()
        dag = conn.execute(
            text("SELECT next_dagrun, next_dagrun_create_after FROM dag WHERE dag_id='old_words'")
        ).one()
    old = [r for r in rows if r.dag_id == "old_words" and r.run_id.startswith("txid-")]
    # ordered by logical date = ordered by txid, each on its millisecond
    assert [r.run_id for r in old] == [txid_run_id(t) for t in range(1, LEGACY_TXIDS + 1)]
    for t in (1, 2, 60_001, LEGACY_TXIDS):
        r = old[t - 1]
        assert r.logical_date == r.data_interval_start == txid_logical_date(t)
        assert r.data_interval_end == r.run_after == txid_logical_date(t) + TXID_STEP
    manual = next(r for r in rows if r.run_id == "manual__x")
    assert manual.logical_date == manual_at
    other = next(r for r in rows if r.dag_id == "other")
    assert other.logical_date == txid_logical_date(5)
    assert dag.next_dagrun == txid_logical_date(LEGACY_TXIDS + 1)

    # and the timetable continues right after the last migrated txid, at once
    last = old[-1]
    info = TxidTimetable().next_dagrun_info(
        last_automated_data_interval=DataInterval(
            pendulum.instance(last.data_interval_start), pendulum.instance(last.data_interval_end)
        ),
        restriction=TimeRestriction(earliest=TXID_EPOCH, latest=None, catchup=True),
    )
    assert info is not None and info.logical_date == txid_logical_date(LEGACY_TXIDS + 1)
    assert info.run_after <= pendulum.now("UTC")  # due at once (run_after: the time it is due)
    engine.dispose()
