"""A txid's own transitions (log/txid_transitions.py) on a real Postgres: a stale attempt's report
ignored, and an attempt's timings recorded with its output."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.exceptions import StaleAttemptError
from airflow_txn_provider.rules.vocabulary import ProcessedAction
from tests.integration.log.txids_given import begin_four, statuses


@pytest.fixture
def four(txlog):
    """max_pending=4, txids 1..4 emitted."""
    return begin_four(txlog)


def test_late_processed_from_old_attempt_is_ignored(four):
    txlog, src = four
    txlog.fail("p", 2, 1)
    txlog.begin("p", 2, src)
    assert txlog.mark_processed("p", 2, 1, {"rows": 1}) is ProcessedAction.IGNORE_STALE
    assert statuses(txlog)[2] == (2, "processing")
    with pytest.raises(StaleAttemptError):
        txlog.commit("p", 2, 1)


def test_an_attempt_records_where_its_time_went(four):
    """The job's timings come with its output, the commit adds its own; a stale report adds none."""
    txlog, _ = four
    output = lambda conn: {"s": 3}  # noqa: E731
    txlog.stage_output("p", 1, 1, output, timings={"start": 1.23456, "spark": 2.5})
    txlog.commit("p", 1, 1)
    (first,) = txlog.attempts("p", 1)
    assert set(first.timings) == {"start", "spark", "commit"}
    assert first.timings["start"] == 1.235 and first.timings["spark"] == 2.5  # rounded to ms
    assert 0 <= first.timings["commit"] < 60
    txlog.fail("p", 2, 1, error="boom")
    assert txlog.stage_output("p", 2, 1, output, timings={"spark": 9.0}) is (
        ProcessedAction.IGNORE_STALE
    )
    assert txlog.attempts("p", 2)[0].timings == {}
