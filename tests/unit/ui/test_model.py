"""The Transactions page's data rules with plain values: counts, lag, durations, chart, states."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.reads import AttemptInfo, TransactionInfo
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import SourceKind, TxStatus
from airflow_txn_provider.ui import model

PROC, DONE, COMMIT, FAIL = (
    TxStatus.PROCESSING,
    TxStatus.PROCESSED,
    TxStatus.COMMITTED,
    TxStatus.FAILED,
)
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def view(*records: tuple[int, TxStatus], last: int = 0) -> PipelineView:
    return PipelineView(
        pipeline="p",
        source_kind=SourceKind.TRANSACTIONAL,
        max_pending=4,
        last_committed=last,
        in_flight=tuple(TxRecord(t, 1, s) for t, s in records),
    )


def tx(
    txid: int,
    status: TxStatus,
    *,
    begun: float | None = None,
    processed: float | None = None,
    committed: float | None = None,
    attempt: int = 1,
    error: str | None = None,
    failed_by: int | None = None,
    metadata: object = None,
) -> TransactionInfo:
    return TransactionInfo(
        pipeline="p",
        txid=txid,
        attempt=attempt,
        status=status,
        metadata=metadata,
        output=None,
        last_error=error,
        begun_at=None if begun is None else at(begun),
        processed_at=None if processed is None else at(processed),
        committed_at=None if committed is None else at(committed),
        failed_by=failed_by,
    )


class TestAccess:
    def test_a_pipeline_is_visible_with_read_access_to_its_dag(self):
        runs = {"words": frozenset({"words_dag"}), "counts": frozenset({"counts"})}
        access = model.DagAccess(dag_ids=frozenset({"words_dag"}), pipeline_dags=runs)
        assert access.visible(["counts", "words", "orphan"]) == ["words"]
        assert not access.may_read("counts")

    def test_a_dag_named_like_a_pipeline_does_not_open_it(self):
        runs = {"words": frozenset({"words_dag"})}
        access = model.DagAccess(dag_ids=frozenset({"words"}), pipeline_dags=runs)
        assert access.visible(["words"]) == []
        assert model.DagAccess(dag_ids=frozenset({"words"})).visible(["words"]) == []

    def test_access_to_all_dags_also_shows_pipelines_without_a_dag(self):
        assert model.DagAccess(all_dags=True).visible(["words", "orphan"]) == ["words", "orphan"]

    def test_no_access_shows_nothing(self):
        assert model.DagAccess().visible(["words"]) == []

    def test_reading_a_dag_is_its_own_permission(self):
        access = model.DagAccess(dag_ids=frozenset({"words_etl"}))
        assert access.may_read_dag("words_etl") and not access.may_read_dag("words")
        assert model.DagAccess(all_dags=True).may_read_dag("anything")
        assert not model.DagAccess().may_read_dag("words_etl")


def never_read() -> list[str]:
    raise AssertionError("the registered pipelines were read although the DAG is recorded")


class TestPipelinesRunBy:
    """Which pipeline the DAG run tab shows for a DAG id."""

    ADMIN = model.DagAccess(all_dags=True)

    def test_the_recorded_pipeline_not_the_one_named_like_the_dag(self):
        runs = {"words": frozenset({"words_etl"}), "words_etl": frozenset({"other"})}
        assert model.pipelines_run_by("words_etl", runs, self.ADMIN, never_read) == ["words"]

    def test_a_dag_recorded_for_several_pipelines_gives_them_all_sorted(self):
        runs = {"b": frozenset({"etl"}), "a": frozenset({"etl", "x"}), "c": frozenset({"x"})}
        assert model.pipelines_run_by("etl", runs, self.ADMIN, never_read) == ["a", "b"]

    def test_without_a_record_a_registered_namesake_the_user_may_read(self):
        assert model.pipelines_run_by("words", {}, self.ADMIN, lambda: ["words"]) == ["words"]
        assert model.pipelines_run_by("words", {}, self.ADMIN, lambda: ["other"]) == []

    def test_a_namesake_run_by_recorded_dags_is_not_this_dags(self):
        runs = {"words": frozenset({"words_etl"})}
        assert model.pipelines_run_by("words", runs, self.ADMIN, lambda: ["words"]) == []

    def test_without_a_record_a_namesake_the_user_may_not_read_is_not_shown(self):
        """Reading a DAG named like a pipeline does not open it (no recorded DAG covers it)."""
        access = model.DagAccess(dag_ids=frozenset({"words"}))
        assert model.pipelines_run_by("words", {}, access, lambda: ["words"]) == []


class TestSummary:
    def test_counts_lag_and_newest_txids(self):
        v = view((4, DONE), (5, DONE), (6, FAIL), (7, PROC), last=3)
        summary = model.pipeline_summary(v)
        assert summary["counts"] == {"processing": 1, "processed": 2, "committed": 3, "failed": 1}
        assert (summary["last_committed"], summary["newest_processed"]) == (3, 5)
        assert summary["lag"] == 2
        assert summary["newest_txid"] == 7
        assert summary["oldest_failed"] == 6
        assert summary["last_committed_run_id"] == "txid-000003"

    def test_nothing_in_flight_means_no_lag(self):
        summary = model.pipeline_summary(view(last=12))
        assert (summary["newest_processed"], summary["lag"], summary["newest_txid"]) == (12, 0, 12)
        assert summary["counts"]["committed"] == 12

    def test_a_new_pipeline(self):
        summary = model.pipeline_summary(view())
        assert summary["counts"] == dict.fromkeys(model.STATUSES, 0)
        assert summary["last_committed_run_id"] is None
        assert summary["lag"] == 0

    def test_processed_txids_after_a_processing_one_count_as_lag(self):
        # txid 4 still processes while 5 is done: 5 is the newest processed, 1 ahead of commits.
        assert model.pipeline_summary(view((4, PROC), (5, DONE), last=3))["lag"] == 2

    def test_window_lists_the_newest_txids(self):
        assert model.window_since(450, 200) == 250
        assert model.window_since(50, 200) == 0


class TestTxidRows:
    NOW = at(100)

    def test_durations_of_a_committed_txid(self):
        row = model.txid_row(tx(3, COMMIT, begun=0, processed=2.5, committed=4), self.NOW)
        assert (row["processing_s"], row["commit_wait_s"]) == (2.5, 1.5)
        assert not row["processing_running"] and not row["commit_wait_running"]
        assert row["run_id"] == "txid-000003"
        assert row["committed_at"] == "2026-03-01T12:00:04+00:00"

    def test_phases_under_way_count_up_to_now(self):
        processing = model.txid_row(tx(5, PROC, begun=90), self.NOW)
        assert (processing["processing_s"], processing["processing_running"]) == (10.0, True)
        assert processing["commit_wait_s"] is None
        waiting = model.txid_row(tx(4, DONE, begun=50, processed=70), self.NOW)
        assert (waiting["commit_wait_s"], waiting["commit_wait_running"]) == (30.0, True)

    def test_lake_tables_show_the_version_each_txid_committed_as(self):
        staged = {"directory": "/t/txn/p/1/a1-x", "files": [["part-0.parquet", 10, 7]], "rows": 7}
        output = {
            "staged:counts": 3,
            "lake:events": {**staged, "commit": {"action": "add", "version": 12, "rows": 7}},
            "lake:latest": {**staged, "commit": {"action": "empty", "version": None}},
            "lake:later": staged,
        }
        assert model.lake_text(output) == ("events v12, later: 7 rows staged, latest: no rows")
        assert model.lake_text(None) == "" and model.lake_text({"staged:x": 1}) == ""

    def test_a_failed_txid_keeps_its_durations_but_does_not_run(self):
        row = model.txid_row(tx(4, FAIL, begun=50, error="boom", failed_by=4), self.NOW)
        assert (row["processing_s"], row["processing_running"]) == (None, False)
        assert row["failed_by_earlier"] is None  # its own failure

    def test_a_cascaded_failure_names_the_earlier_txid(self):
        row = model.txid_row(
            tx(5, FAIL, begun=50, error="failed with txid 4", failed_by=4), self.NOW
        )
        assert row["failed_by_earlier"] == 4

    def test_a_rewound_txid_names_no_earlier_txid_its_error_says_rewound(self):
        error = "rewound to txid 3 by alice"
        row = model.txid_row(tx(5, FAIL, begun=50, error=error, failed_by=0), self.NOW)
        assert row["failed_by_earlier"] is None and row["last_error"] == error

    def test_rows_are_newest_first_with_compact_metadata(self):
        rows = model.txid_rows(
            [tx(1, COMMIT, metadata={"start": 0, "end": 10}), tx(2, PROC, metadata=None)], self.NOW
        )
        assert [r["txid"] for r in rows] == [2, 1]
        assert rows[1]["metadata_json"] == '{"end":10,"start":0}'
        assert rows[0]["metadata_json"] == ""

    def test_attempt_rows(self):
        attempts = [
            AttemptInfo("p", 4, 1, FAIL, {"a": 1}, None, "boom", at(0), at(3), at(5), 4),
            AttemptInfo("p", 4, 2, PROC, {"a": 1}, None, None, at(90), None, None, None),
        ]
        rows = model.attempt_rows(attempts, self.NOW)
        assert [r["attempt"] for r in rows] == [2, 1]
        assert (rows[1]["processing_s"], rows[1]["total_s"], rows[1]["error"]) == (3.0, 5.0, "boom")
        assert (rows[0]["processing_s"], rows[0]["processing_running"]) == (10.0, True)
        assert rows[0]["total_s"] is None
        assert rows[0]["timings_text"] == ""  # nothing reported yet

    def test_where_an_attempts_time_went_reads_in_phase_order(self):
        timings = {"commit": 0.02, "spark": 3.456, "job_b.spark": 1.0, "start": 1.2, "staging": 0.1}
        attempt = AttemptInfo(
            "p", 4, 1, COMMIT, None, None, None, at(0), at(3), at(5), None, timings
        )
        row = model.attempt_row(attempt, self.NOW)
        assert row["timings_text"] == (
            "start 1.20 s · spark 3.46 s · staging 0.10 s · commit 0.02 s · job_b.spark 1.00 s"
        )
        assert row["timings"] == timings


class TestFormatting:
    @pytest.mark.parametrize(
        ("seconds", "text"),
        [
            (None, "—"),
            (0.349, "0.35 s"),
            (12.34, "12.3 s"),
            (245, "4m 05s"),
            (7380, "2h 03m"),
            (float("nan"), "—"),
        ],
    )
    def test_durations(self, seconds, text):
        assert model.format_duration(seconds) == text

    def test_clock_shows_the_date_only_for_another_day(self):
        now = "2026-03-01T18:00:00+00:00"
        assert model.clock("2026-03-01T12:00:04+00:00", now) == "12:00:04"
        assert model.clock("2026-02-28T23:59:59+00:00", now) == "2026-02-28 23:59:59"
        assert model.clock("2026-03-01T14:00:04+02:00", now) == "12:00:04"  # shown in UTC
        assert model.clock(None, now) == "—"

    def test_iso_is_utc(self):
        local = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
        assert model.iso(local) == "2026-03-01T12:00:00+00:00"
        assert model.iso(None) is None

    def test_compact_json_is_cut(self):
        assert model.compact_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
        long = model.compact_json({"k": "x" * 500}, limit=20)
        assert len(long) == 20 and long.endswith("…")

    def test_durations_never_go_negative(self):
        assert model.seconds_between(at(5), at(3)) == 0.0


class TestChart:
    NOW = at(300)

    def test_committed_processed_and_lag_over_time(self):
        txs = [
            tx(11, COMMIT, begun=0, processed=10, committed=12),
            tx(12, COMMIT, begun=0, processed=11, committed=20),
            tx(13, DONE, begun=5, processed=15),
            tx(14, PROC, begun=16),
        ]
        chart = model.chart_series(txs, self.NOW)
        t = T0.timestamp()
        assert chart["processed"] == [[t + 10, 11.0], [t + 11, 12.0], [t + 15, 13.0]]
        assert chart["committed"] == [[t + 12, 11.0], [t + 20, 12.0]]
        # processed - committed after each event, starting from the txid before the window (10)
        assert [p[1] for p in chart["lag"]] == [1.0, 2.0, 1.0, 2.0, 1.0]
        assert chart["now"] == t + 300

    def test_an_older_txid_processed_later_does_not_lower_the_line(self):
        txs = [tx(1, DONE, processed=30), tx(2, DONE, processed=10)]
        chart = model.chart_series(txs, self.NOW)
        assert [p[1] for p in chart["processed"]] == [2.0]

    def test_failed_txids_are_not_processed(self):
        chart = model.chart_series([tx(1, FAIL, begun=0, processed=5)], self.NOW)
        assert chart["processed"] == [] and chart["lag"] == []

    def test_commits_per_minute_and_recent_rate(self):
        txs = [tx(i, COMMIT, processed=c - 1, committed=c) for i, c in enumerate([1, 2, 70], 1)]
        chart = model.chart_series(txs, at(100))
        minute = T0.timestamp()
        assert chart["per_minute"] == [[minute, 2.0], [minute + 60, 1.0]]
        assert chart["rate_per_min"] == pytest.approx(3 / 5)

    def test_empty(self):
        chart = model.chart_series([], self.NOW)
        assert chart["committed"] == [] and chart["rate_per_min"] == 0.0


class TestStates:
    def test_map_summary(self):
        summary = model.map_state_summary(
            "word_counts",
            "transactional",
            ["word"],
            3,
            Decimal("12"),
            [("dog", 7), ("cat", 4)],
        )
        assert summary == {
            "name": "word_counts",
            "kind": "transactional",
            "type": "map",
            "key_columns": ["word"],
            "keys": 3,
            "sum": 12,
            "top": [{"key": "dog", "value": 7}, {"key": "cat", "value": 4}],
        }

    def test_compound_keys_and_decimal_values(self):
        summary = model.map_state_summary(
            "m", "opaque", ["region", "day"], 1, Decimal("2.5"), [("eu", 3, Decimal("2.5"))]
        )
        assert summary["top"] == [{"key": "eu, 3", "value": 2.5}]
        assert summary["sum"] == 2.5

    def test_an_empty_map_sums_to_zero(self):
        assert model.map_state_summary("m", "opaque", ["k"], 0, None, [])["sum"] == 0

    def test_global_summary(self):
        assert model.global_state_summary("total", "opaque", Decimal("42"))["value"] == 42
        assert model.global_state_summary("total", "opaque", None)["value"] is None


def test_a_password_stored_in_an_error_before_redaction_is_not_shown():
    leaked = "catalog postgresql://ice:Pl4nted-S3cret@db/cat refused the batch"
    row = model.txid_row(tx(4, TxStatus.FAILED, error=leaked, failed_by=4), at(10))
    assert row["last_error"] == "catalog postgresql://ice:***@db/cat refused the batch"
    attempt = AttemptInfo(
        pipeline="p",
        txid=4,
        attempt=1,
        status=TxStatus.FAILED,
        metadata=None,
        output=None,
        started_at=at(0),
        processed_at=None,
        ended_at=at(3),
        error=leaked,
        failed_by=4,
    )
    assert "Pl4nted-S3cret" not in model.attempt_row(attempt, at(10))["error"]
