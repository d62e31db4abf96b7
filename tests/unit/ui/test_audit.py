"""What the Transactions page shows of each txid's audit (issue 60), with plain values: an
attempt's outcomes in a few words, each txid's current attempt, a txid's panel, each
expectation's trend and its sparkline."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.expectations import QuarantinedRow
from airflow_txn_provider.log.reads import AttemptInfo
from airflow_txn_provider.rules.expectations import (
    Measured,
    RowCondition,
    RowCount,
    RowCountWithinSigma,
    judge_expectations,
    outcome_record,
)
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.ui import audit, model, reader

PROC, COMMIT = TxStatus.PROCESSING, TxStatus.COMMITTED
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def judged(*measured, history=None):
    """Outcome records as a commit stores them, judged by the rules from ``measured``."""
    declared = [
        RowCondition(on="w", condition="delta > 0", name="positive"),
        RowCondition(on="w", condition="word <> 'x'", action="drop", name="no x"),
        RowCount(on="w", max=10, action="fail", name="small"),
        RowCountWithinSigma(on="w", name="steady"),
        RowCondition(on="w", condition="delta < 100", action="fail", name="bounded"),
    ]
    verdict = judge_expectations(
        [d for d in declared if d.name in {m.expectation for m in measured}],
        measured,
        {"steady": history or []},
    )
    return [outcome_record(o) for o in verdict.outcomes]


class TestAuditSummary:
    def measured(self, **failed):
        rows = failed.pop("rows", 8)
        names = ("positive", "no x", "small", "bounded")
        return [Measured(n, rows, failed.get(n.replace(" ", "_"), 0)) for n in names]

    def test_nothing_recorded_says_nothing(self):
        assert audit.audit_summary(()) == {"text": "", "level": "", "title": ""}

    def test_all_passed(self):
        found = audit.audit_summary(judged(*self.measured()))
        assert (found["text"], found["level"]) == ("4 passed", "passed")
        assert found["title"].splitlines()[0] == "positive on w (warn): passed, 0 of 8 rows failed"

    def test_the_worst_comes_first_and_drops_count_their_rows(self):
        outcomes = judged(*self.measured(positive=2, no_x=3))
        found = audit.audit_summary(outcomes)
        assert found["text"] == "1 warned · 1 dropped (3 rows) · 2 passed"
        assert found["level"] == "warned"
        stopped = audit.audit_summary(judged(*self.measured(rows=12, positive=1, bounded=4)))
        assert stopped["text"] == "failed: small, bounded · 1 warned · 1 passed"
        assert stopped["level"] == "failed"
        assert stopped["title"].splitlines()[:2] == [
            "small on w (fail): failed, 0 of 12 rows failed",
            "bounded on w (fail): failed, 4 of 12 rows failed",
        ]

    def test_a_young_sigma_bound_says_so(self):
        found = audit.audit_summary(judged(Measured("steady", 5), history=[5, 6]))
        assert (found["text"], found["level"]) == ("1 not enough history", "not_enough_history")

    def test_each_attempt_carries_its_own(self):
        outcomes = judged(*self.measured(positive=1))
        attempt = AttemptInfo(
            "p", 4, 1, COMMIT, None, None, None, at(0), at(1), at(2), expectations=outcomes
        )
        assert model.attempt_row(attempt, at(3))["audit"] == audit.audit_summary(outcomes)
        bare = AttemptInfo("p", 4, 2, PROC, None, None, None, at(0), None, None)
        assert model.attempt_row(bare, at(3))["audit"]["text"] == ""


def outcome(name, taken, failed=0, *, checked=10, on="w", action="warn", keys=(), message=""):
    """An outcome record as :func:`~airflow_txn_provider.rules.expectations.outcome_record`
    writes it."""
    return {
        "expectation": name,
        "on": on,
        "action": action,
        "taken": taken,
        "rows_checked": checked,
        "rows_failed": failed,
        "sample_keys": list(keys),
        "message": message or f"{failed} of {checked} rows fail: {taken}",
    }


def test_a_sparkline_spans_its_box_from_the_first_txid_to_the_last():
    assert audit.sparkline([]) == ""
    assert audit.sparkline([[1, 0], [3, 10], [5, 5]]) == "1.0,27.0 80.0,1.0 159.0,14.0"
    assert audit.sparkline([[7, 0], [8, 0]]) == "1.0,27.0 159.0,27.0"  # nothing failed: bottom
    assert audit.sparkline([[4, 3]]) == "1.0,1.0 159.0,1.0"  # one txid: a level line
    assert audit.sparkline([[1, 2], [2, 4]], box=(10, 10)) == "1.0,5.0 9.0,1.0"


def test_an_expectations_trend_counts_its_committed_txids_and_the_listed_txids_it_stopped():
    committed = [
        (1, [outcome("pos", "passed"), outcome("nox", "dropped", 3, action="drop")]),
        (2, [outcome("pos", "warned", 2), outcome("nox", "passed", action="drop")]),
        (4, [outcome("pos", "warned", 6, on="w2"), outcome("nox", "dropped", 1, action="drop")]),
    ]
    audited = [
        (3, 1, [outcome("pos", "warned", 1), outcome("big", "failed", action="fail")]),
        (3, 2, [outcome("pos", "passed"), outcome("big", "failed", action="fail")]),
        (4, 1, [outcome("pos", "warned", 6), outcome("nox", "dropped", 1, action="drop")]),
    ]
    trends = {t["expectation"]: t for t in audit.expectation_trends(committed, audited)}
    assert list(trends) == ["pos", "nox", "big"]
    pos = trends["pos"]
    assert pos["points"] == [[1, 0], [2, 2], [4, 6]]
    assert (pos["passed"], pos["warned"], pos["dropped"], pos["failed"]) == (1, 2, 0, 0)
    assert (pos["txids"], pos["first_txid"], pos["last_txid"], pos["max_failed"]) == (3, 1, 4, 6)
    assert pos["on"] == "w2"  # as the newest txid declares it
    assert pos["spark"] == audit.sparkline(pos["points"])
    assert (trends["nox"]["dropped"], trends["nox"]["passed"]) == (2, 1)
    big = trends["big"]  # stopped txid 3 twice: one txid; never committed
    assert (big["failed"], big["txids"], big["points"], big["spark"]) == (1, 0, [], "")
    assert (big["first_txid"], big["max_failed"], big["action"]) == (None, 0, "fail")
    assert audit.expectation_trends([], []) == []


def test_each_txid_row_gets_its_current_attempts_audit():
    rows = [{"txid": 5, "attempt": 2}, {"txid": 4, "attempt": 1}, {"txid": 3, "attempt": 1}]
    audited = [
        (4, 1, [outcome("pos", "warned", 1)]),
        (5, 1, [outcome("big", "failed", action="fail")]),  # an earlier attempt of 5
    ]
    found = {r["txid"]: r["audit"]["text"] for r in audit.with_audit(rows, audited)}
    assert found == {5: "", 4: "1 warned", 3: ""}


def test_a_txids_panel_shows_its_newest_audited_attempt_and_its_quarantine():
    when = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)
    leaked = "cannot be evaluated: could not connect to postgresql://u:Pl4nted-S3cret@db/x"

    def attempt(n, status, outcomes=()):
        return AttemptInfo(
            "p", 7, n, status, None, None, None, when, None, None, expectations=tuple(outcomes)
        )

    stopped = [outcome("big", "failed", action="fail", message=leaked, keys=["k1"])]
    attempts = [attempt(1, TxStatus.FAILED, stopped), attempt(2, TxStatus.PROCESSING)]
    rows = [QuarantinedRow("w", 7, 1, ("nox",), {"word": "<x>", "delta": 2}, when)]
    panel = reader.txid_audit(attempts, rows, {"w": 3, "a": 1})
    assert (panel["attempt"], panel["summary"]["text"]) == (1, "failed: big")
    [shown] = panel["outcomes"]
    assert shown["sample_keys"] == ["k1"] and "Pl4nted-S3cret" not in shown["message"]
    assert shown["message"].endswith("postgresql://u:***@db/x")
    assert (panel["quarantined"], panel["quarantined_by_output"]) == (4, {"a": 1, "w": 3})
    assert panel["quarantine"] == [
        {
            "output": "w",
            "attempt": 1,
            "expectations": ["nox"],
            "row": {"word": "<x>", "delta": 2},
            "row_json": '{"delta":2,"word":"<x>"}',
            "quarantined_at": "2026-03-01T12:00:00+00:00",
        }
    ]
    none = reader.txid_audit([attempt(1, TxStatus.PROCESSING)], [], {})
    assert (none["attempt"], none["outcomes"], none["quarantined"]) == (None, [], 0)
