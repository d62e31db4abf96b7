"""How far a lake table goes back: which version holds each txid now, and which commits a rewind
undoes (sinks/rewind.py, pure)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.coordinator import plan_sink_commit
from airflow_txn_provider.rules.exceptions import LakeTableOutOfSyncError
from airflow_txn_provider.sinks.rewind import first_undone_commit, held_versions

WHERE = {"pipeline": "p", "attempt": 2, "sink": "s"}


class TestHeldVersions:
    """Which table version holds each txid now: ``(version, pipeline, txid)``, newest first."""

    def test_each_txids_newest_commit_and_not_a_replaced_attempts(self):
        commits = [(5, "p", 3), (4, "p", 2), (3, "p", 2), (2, "q", 7), (1, "p", 1)]
        assert held_versions(commits, pipeline="p") == [(1, 1), (2, 4), (3, 5)]

    def test_commits_a_rewind_went_back_past_hold_nothing(self):
        # 6: a rewind stamped txid 1 (Delta's RESTORE); 7, 8: txids 2 and 3 recomputed on it.
        commits = [(8, "p", 3), (7, "p", 2), (6, "p", 1), (5, "p", 4), (4, "p", 3), (3, "p", 2)]
        commits += [(2, "p", 1)]
        assert held_versions(commits, pipeline="p") == [(1, 6), (2, 7), (3, 8)]
        # Iceberg's rewind to txid 0 is a delete on top of the undone snapshots
        assert held_versions([(9, "p", 0), (8, "p", 2), (7, "p", 1)], pipeline="p") == []


class TestFirstUndoneCommit:
    """Which commits a rewind undoes: ``(version, pipeline, txid)``, newest first."""

    def test_the_pipelines_commits_above_the_txid_back_to_its_commit_of_the_txid(self):
        commits = [(7, "p", 3), (6, "p", 2), (5, "p", 1), (4, None, None)]
        assert first_undone_commit(commits, pipeline="p", keep_txid=1, sink="s") == 6
        assert first_undone_commit(commits, pipeline="p", keep_txid=0, sink="s") == 5
        assert first_undone_commit(commits, pipeline="p", keep_txid=3, sink="s") is None

    def test_a_rewind_commit_stamped_with_the_kept_txid_stops_the_walk(self):
        # 9: txid 2 again after a rewind (8) that took the table back to txid 1.
        commits = [(9, "p", 2), (8, "p", 1), (7, "p", 2), (6, "p", 1)]
        assert first_undone_commit(commits, pipeline="p", keep_txid=1, sink="s") == 9

    def test_another_writer_before_the_undone_commits_is_kept(self):
        commits = [(7, "p", 2), (6, "q", 9), (5, "p", 1)]
        assert first_undone_commit(commits, pipeline="p", keep_txid=1, sink="s") == 7

    def test_another_writer_after_them_is_refused(self):
        # Positions, not versions, order commits: Iceberg's snapshot ids are random.
        commits = [(11, "q", 1), (99, "p", 2), (3, "p", 1)]
        with pytest.raises(LakeTableOutOfSyncError, match=r"another writer .*\[11\]"):
            first_undone_commit(commits, pipeline="p", keep_txid=1, sink="s")

    def test_a_table_ahead_of_the_log_is_refused_naming_the_txid(self):
        with pytest.raises(LakeTableOutOfSyncError) as err:
            plan_sink_commit(9, 5, **WHERE)
        assert "pipeline=p txid=5 attempt=2" in str(err.value)
        assert "already holds txid 9" in str(err.value)
