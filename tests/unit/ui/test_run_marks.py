"""The listener that notes a txid's run marked by hand: which calls it answers, and what it
writes (the real api-server calls it in tests/integration/on_airflow/test_ui_buttons.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_txn_provider.ui import run_marks
from tests.unit.builders import PROC, view

BY_HAND = "Dag Run's state was manually set to `success`."


class Log:
    def view(self, pipeline):
        assert pipeline == "words"
        return view((2, 1, PROC), last=1)


@pytest.fixture
def provider(monkeypatch):
    from airflow_txn_provider.ui import access

    monkeypatch.setattr(access.provider, "get", Log)


def _run(run_id="txid-000002", pipelines=("words",)):
    tasks = [SimpleNamespace(pipeline_name=p) for p in pipelines]
    return SimpleNamespace(run_id=run_id, dag=SimpleNamespace(tasks=tasks), note=None)


def test_a_txid_run_marked_by_hand_gets_a_note_from_the_log(provider):
    run = _run()
    note = run_marks.note_mark(run, BY_HAND, "success")
    assert note is not None and run.note == note
    assert "while txid 2 attempt 1 was processing" in note


@pytest.mark.parametrize(
    ("run", "msg"),
    [
        (_run(), "success"),  # the scheduler: the run ended by itself
        (_run(run_id="manual__2026"), BY_HAND),  # not a txid's run
        (_run(pipelines=()), BY_HAND),  # not a transaction DAG
        (_run(pipelines=("a", "b")), BY_HAND),  # which pipeline is unclear
    ],
)
def test_other_runs_and_runs_that_ended_by_themselves_get_nothing(provider, run, msg):
    assert run_marks.note_mark(run, msg, "success") is None
    assert run.note is None


def test_a_log_that_cannot_be_read_leaves_the_click_alone(monkeypatch, caplog):
    from airflow_txn_provider.ui import access

    def broken():
        raise RuntimeError("no database")

    monkeypatch.setattr(access.provider, "get", broken)
    run = _run()
    assert run_marks.note_mark(run, BY_HAND, "failed") is None
    assert run.note is None and "no note on run txid-000002" in caplog.text
