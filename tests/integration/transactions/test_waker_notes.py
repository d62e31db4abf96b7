"""What the waker notes on a pipeline's row (transactions/waker_notes.py), through the log."""

from __future__ import annotations

import time

from airflow_txn_provider.log.health import read_run_trouble


def test_runs_made_is_never_lowered(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    assert txlog.view("p").runs_made_through == 0
    txlog.note_runs_made("p", 5)
    txlog.note_runs_made("p", 3)  # a slower waker's older note
    assert txlog.view("p").runs_made_through == 5
    txlog.waker_notes.note_runs_made("p", 7)  # the part itself, as the log lends it
    assert txlog.view("p").runs_made_through == 7


def test_run_trouble_keeps_its_start_while_it_lasts_and_clears(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=4)
    with txlog.engine.connect() as conn:
        assert read_run_trouble(conn, "p") is None
    txlog.report_run_trouble("p", "the api-server refused a run")
    with txlog.engine.connect() as conn:
        first = read_run_trouble(conn, "p")
    assert first is not None and first[0] == "the api-server refused a run"
    time.sleep(0.05)
    txlog.report_run_trouble("p", "the api-server still refuses")
    with txlog.engine.connect() as conn:
        again = read_run_trouble(conn, "p")
    assert again == ("the api-server still refuses", first[1])  # since the trouble began
    txlog.report_run_trouble("p", None)
    with txlog.engine.connect() as conn:
        assert read_run_trouble(conn, "p") is None
