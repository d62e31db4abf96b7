"""The one rule of which DAG grants a pipeline (``reader.pipeline_dags``), with plain values: a
pairing the log recorded counts only while its DAG exists and runs that pipeline now. And the
audit's shaping (issue 60): each txid's current attempt, a txid's panel, each expectation's
trend and its sparkline."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy.exc import ProgrammingError

from airflow_txn_provider.log.expectations import QuarantinedRow
from airflow_txn_provider.log.reads import AttemptInfo
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.ui import reader


class FakeLog:
    """The log's pairing methods over a dict: pipeline -> DAG ids recorded as running it."""

    def __init__(self, recorded: dict[str, set[str]], *, writable: bool = True):
        self.recorded = {p: set(ids) for p, ids in recorded.items()}
        self.writable = writable
        self.forgotten: list[list[tuple[str, str]]] = []

    def pipeline_dags(self):
        return {p: set(ids) for p, ids in self.recorded.items() if ids}

    def forget_pipeline_dags(self, pairs):
        pairs = list(pairs)
        self.forgotten.append(pairs)
        if not self.writable:
            raise ProgrammingError("DELETE", {}, Exception("permission denied"))
        for pipeline, dag_id in pairs:
            self.recorded[pipeline].discard(dag_id)
        return len(pairs)


def airflow(dags: dict[str, set[str]]):
    """Airflow's DAGs now: DAG id -> pipelines it declares; a DAG not listed does not exist."""
    asked: list[set[str]] = []

    def dag_pipelines(dag_ids):
        asked.append(set(dag_ids))
        return {d: frozenset(dags[d]) for d in dag_ids if d in dags}

    dag_pipelines.asked = asked  # type: ignore[attr-defined]
    return dag_pipelines


def test_a_pairing_counts_while_its_dag_runs_the_pipeline():
    log = FakeLog({"words": {"words_etl"}, "counts": {"counts"}})
    dags = airflow({"words_etl": {"words"}, "counts": {"counts"}, "unrelated": {"x"}})
    assert reader.pipeline_dags(log, dags) == {
        "words": frozenset({"words_etl"}),
        "counts": frozenset({"counts"}),
    }
    assert dags.asked == [{"words_etl", "counts"}]  # only the recorded DAGs are looked up
    assert log.forgotten == []


def test_a_deleted_dag_grants_nothing_and_its_pairing_is_deleted():
    log = FakeLog({"words": {"words_etl", "words_old"}})
    assert reader.pipeline_dags(log, airflow({"words_etl": {"words"}})) == {
        "words": frozenset({"words_etl"})
    }
    assert log.forgotten == [[("words", "words_old")]]
    assert log.recorded == {"words": {"words_etl"}}


def test_a_reused_dag_id_grants_the_pipeline_it_runs_now_only():
    log = FakeLog({"old": {"etl"}, "new": {"etl"}})
    assert reader.pipeline_dags(log, airflow({"etl": {"new"}})) == {"new": frozenset({"etl"})}
    assert log.forgotten == [[("old", "etl")]]
    # Before the new pipeline's claim ran, the DAG grants neither.
    log = FakeLog({"old": {"etl"}})
    assert reader.pipeline_dags(log, airflow({"etl": {"new"}})) == {}
    assert log.recorded == {"old": set()}


def test_a_dag_that_declares_no_pipeline_grants_nothing_and_keeps_its_pairing():
    """Serialized by a version before the declaration (until the DAG processor parses it again),
    or no transaction DAG any more: nothing says what it runs, so nothing is granted or deleted."""
    log = FakeLog({"words": {"words_etl"}})
    assert reader.pipeline_dags(log, airflow({"words_etl": set()})) == {}
    assert log.forgotten == [] and log.recorded == {"words": {"words_etl"}}


def test_a_log_the_page_may_not_write_still_grants_nothing_stale(caplog):
    log = FakeLog({"words": {"gone"}}, writable=False)
    assert reader.pipeline_dags(log, airflow({})) == {}
    assert log.forgotten == [[("words", "gone")]]
    assert "not deleted" in caplog.text


def test_no_pairing_asks_airflow_nothing():
    dags = airflow({})
    assert reader.pipeline_dags(FakeLog({}), dags) == {}
    assert dags.asked == []


# -- the audit before each commit (issue 60), with plain values ---------------------------------


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
    assert reader.sparkline([]) == ""
    assert reader.sparkline([[1, 0], [3, 10], [5, 5]]) == "1.0,27.0 80.0,1.0 159.0,14.0"
    assert reader.sparkline([[7, 0], [8, 0]]) == "1.0,27.0 159.0,27.0"  # nothing failed: bottom
    assert reader.sparkline([[4, 3]]) == "1.0,1.0 159.0,1.0"  # one txid: a level line
    assert reader.sparkline([[1, 2], [2, 4]], box=(10, 10)) == "1.0,5.0 9.0,1.0"


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
    trends = {t["expectation"]: t for t in reader.expectation_trends(committed, audited)}
    assert list(trends) == ["pos", "nox", "big"]
    pos = trends["pos"]
    assert pos["points"] == [[1, 0], [2, 2], [4, 6]]
    assert (pos["passed"], pos["warned"], pos["dropped"], pos["failed"]) == (1, 2, 0, 0)
    assert (pos["txids"], pos["first_txid"], pos["last_txid"], pos["max_failed"]) == (3, 1, 4, 6)
    assert pos["on"] == "w2"  # as the newest txid declares it
    assert pos["spark"] == reader.sparkline(pos["points"])
    assert (trends["nox"]["dropped"], trends["nox"]["passed"]) == (2, 1)
    big = trends["big"]  # stopped txid 3 twice: one txid; never committed
    assert (big["failed"], big["txids"], big["points"], big["spark"]) == (1, 0, [], "")
    assert (big["first_txid"], big["max_failed"], big["action"]) == (None, 0, "fail")
    assert reader.expectation_trends([], []) == []


def test_each_txid_row_gets_its_current_attempts_audit():
    rows = [{"txid": 5, "attempt": 2}, {"txid": 4, "attempt": 1}, {"txid": 3, "attempt": 1}]
    audited = [
        (4, 1, [outcome("pos", "warned", 1)]),
        (5, 1, [outcome("big", "failed", action="fail")]),  # an earlier attempt of 5
    ]
    found = {r["txid"]: r["audit"]["text"] for r in reader.with_audit(rows, audited)}
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
