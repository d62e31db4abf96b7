"""The lake sinks' pure parts: the commit rule, declarations and specs (the schema check:
test_schema.py; how far a rewind takes a table back: test_rewind.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_txn_provider.rules.coordinator import plan_sink_commit
from airflow_txn_provider.rules.exceptions import LakeTableOutOfSyncError
from airflow_txn_provider.rules.vocabulary import SinkAction
from airflow_txn_provider.sinks import DeltaSink, IcebergSink, StagedFiles, sink_from_spec
from airflow_txn_provider.sinks.base import schema_to_hex
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.spark.job import BatchJob

WHERE = {"pipeline": "p", "attempt": 2, "sink": "s"}


class TestPlanSinkCommit:
    def test_a_table_behind_the_txid_gets_the_files(self):
        assert plan_sink_commit(0, 1, **WHERE) is SinkAction.ADD
        assert plan_sink_commit(4, 5, **WHERE) is SinkAction.ADD
        # Txids without rows make no table commit: the table may be several txids behind.
        assert plan_sink_commit(2, 9, **WHERE) is SinkAction.ADD

    def test_a_table_holding_this_attempt_of_the_txid_gets_nothing_twice(self):
        assert plan_sink_commit(5, 5, table_attempt=2, **WHERE) is SinkAction.ALREADY_IN_TABLE

    def test_a_table_holding_another_attempt_of_the_txid_is_replaced(self):
        # A commit that failed after this table's commit (at another sink), then replayed: the
        # table must end with the committed attempt's rows, not the failed one's.
        assert plan_sink_commit(5, 5, table_attempt=1, **WHERE) is SinkAction.REPLACE
        assert plan_sink_commit(5, 5, table_attempt=None, **WHERE) is SinkAction.REPLACE

    def test_a_table_ahead_with_txids_a_rewind_undid_follows_the_log_at_the_next_commit(self):
        # A rewind to 5 failed txids 5..9 (7 committed, 8 and 9 in flight); the table still holds
        # up to 8 (a crash before the rewind's own table step, or a store out of reach then).
        for table_txid in (5, 6, 8, 9):
            assert plan_sink_commit(table_txid, 5, rewound_through=9, **WHERE) is (
                SinkAction.REPLACE
            )
        # Replayed in order: txid 6 finds the table at 5 (the replay's) and adds.
        assert plan_sink_commit(5, 6, rewound_through=9, **WHERE) is SinkAction.ADD

    def test_a_table_ahead_that_holds_this_attempt_of_the_txid_gets_nothing_twice(self):
        # A fill killed inside its chunk 6..10 after the tables' commits of txids 6..9: the
        # output's progress in the log says 5, the log has committed through 12. The retry finds
        # each txid in the table by its committed attempt.
        for txid in (6, 7, 8, 9):
            assert plan_sink_commit(9, txid, table_attempt=2, committed_through=12, **WHERE) is (
                SinkAction.ALREADY_IN_TABLE
            )
        assert plan_sink_commit(9, 10, committed_through=12, **WHERE) is SinkAction.ADD

    def test_a_table_ahead_of_the_log_itself_is_refused_even_with_the_same_attempt(self):
        # A log reset (or another log) starts again at attempt 1 of txid 1: the table's txid 1
        # of attempt 1 is not this log's.
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 7"):
            plan_sink_commit(7, 1, table_attempt=1, pipeline="p", attempt=1, sink="s")
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 9"):
            plan_sink_commit(9, 6, table_attempt=2, committed_through=8, **WHERE)

    def test_a_table_ahead_holding_another_attempt_of_the_txid_is_refused_unless_rewound(self):
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 9"):
            plan_sink_commit(9, 7, table_attempt=1, committed_through=12, **WHERE)
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 9"):
            plan_sink_commit(9, 7, committed_through=12, **WHERE)  # not in the table at all
        assert plan_sink_commit(9, 7, table_attempt=1, rewound_through=9, **WHERE) is (
            SinkAction.REPLACE
        )

    def test_a_table_ahead_of_what_any_rewind_undid_is_refused(self):
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 10"):
            plan_sink_commit(10, 5, rewound_through=9, **WHERE)
        with pytest.raises(LakeTableOutOfSyncError, match="already holds txid 7"):
            plan_sink_commit(7, 5, **WHERE)  # never rewound


class TestDeclarations:
    def test_specs_round_trip(self):
        sinks = [
            DeltaSink("events", table_uri="/lake/events/", txid_column="txid"),
            DeltaSink("latest", table_uri="s3://bucket/t", mode="merge", keys=["k"]),
            IcebergSink("ice", table="ns.t", warehouse="/wh", catalog_name="c"),
        ]
        for sink in sinks:
            assert sink_from_spec(sink.to_spec()) == sink
        assert sinks[0].table_uri == "/lake/events"  # trailing slash dropped
        job = BatchJob("p", 1, 1, GeneratedTextSource(), sinks=tuple(sinks))
        assert BatchJob.from_args(job.to_args()) == job

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"table_uri": "relative/path"}, "absolute path or a URI"),
            ({"table_uri": "/t", "mode": "upsert"}, "mode must be one of"),
            ({"table_uri": "/t", "mode": "merge"}, "merge mode needs the key columns"),
            ({"table_uri": "/t", "keys": ["k"]}, "keys apply to merge mode only"),
            ({"table_uri": "/t", "txid_column": "bad name"}, "txid_column 'bad name' is refused"),
        ],
    )
    def test_bad_delta_declarations_are_refused(self, kwargs, message):
        with pytest.raises(ValueError, match=message):
            DeltaSink("s", **kwargs)

    def test_bad_iceberg_declarations_are_refused(self):
        with pytest.raises(ValueError, match=r"namespace\.name"):
            IcebergSink("s", table="t", warehouse="/wh")
        with pytest.raises(ValueError, match="warehouse"):
            IcebergSink("s", table="ns.t", warehouse="wh")

    def test_staging_is_per_pipeline_txid_attempt_and_run_under_the_table(self):
        sink = DeltaSink("s", table_uri="/lake/t")
        assert (
            sink.stage_dir("words", 42, 3, "r1") == "/lake/t/txn/words/00000000000000000042/a3-r1"
        )
        ice = IcebergSink("s", table="ns.t", warehouse="/wh")
        assert ice.staging_root == "/wh/ns.db/t/data/txn"
        assert ice.uri == "iceberg://txn/ns/t" and sink.uri == "file:///lake/t"
        with pytest.raises(ValueError, match="lake staging directory"):
            sink.txid_dir("no/slashes", 1)

    def test_staged_files_keep_their_schema_and_rows(self):
        schema = pa.schema([("word", pa.string())])
        staged = StagedFiles(
            "/d", (("a.parquet", 10, 3), ("b.parquet", 12, 4)), schema_to_hex(schema)
        )
        again = StagedFiles.from_json(staged.to_json())
        assert again == staged and again.rows == 7
        assert again.arrow_schema() == schema
        assert again.paths() == ["/d/a.parquet", "/d/b.parquet"]


def test_a_missing_format_library_says_which_extra_to_install(monkeypatch):
    import sys

    from airflow_txn_provider.rules.exceptions import LakeSinkError

    monkeypatch.setitem(sys.modules, "deltalake", None)  # as if not installed
    with pytest.raises(LakeSinkError, match=r"airflow-txn-provider\[delta\]"):
        DeltaSink("s", table_uri="/lake/t").open()
