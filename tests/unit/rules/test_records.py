"""A pipeline's snapshot as the rules read it (rules/records.py), with plain values: its window,
the log's invariants checked when it is built, the metadata before a txid."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.exceptions import CorruptLogError
from airflow_txn_provider.rules.vocabulary import TxStatus
from tests.unit.builders import PROC, view


class TestView:
    def test_window_starts_at_oldest_uncommitted(self):
        v = view((3, 1, PROC), last=2, max_pending=4)
        assert v.window == range(3, 7)
        assert v.next_new_txid == 4

    def test_gap_in_flight_is_corrupt(self):
        with pytest.raises(CorruptLogError, match="expected txid 2, found 3") as err:
            view((1, 1, PROC), (3, 1, PROC))
        assert err.value.pipeline == "p" and err.value.txid == 3 and err.value.attempt == 1

    def test_committed_in_flight_is_corrupt(self):
        with pytest.raises(CorruptLogError, match="marked committed"):
            view((1, 1, TxStatus.COMMITTED))

    def test_attempt_zero_is_corrupt(self):
        with pytest.raises(CorruptLogError, match="attempt must be >= 1"):
            view((1, 0, PROC))

    def test_metadata_before_uses_committed_metadata(self):
        v = view((3, 1, PROC), last=2)
        assert v.metadata_before(3) == {"end": 20}
        assert v.metadata_before(4) == {"end": 30}
        assert view().metadata_before(1) is None
