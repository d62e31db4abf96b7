"""What the Transactions page says about a rewind (ui/rewind_options.py), with plain values: on
which txids it offers "Rewind to here", what it recomputes, how far back it reaches, who may."""

from __future__ import annotations

import pytest

from airflow_txn_provider.ui import rewind_options
from tests.unit.ui.test_model import DONE, FAIL, PROC, view


class TestRewind:
    """ "Rewind to here": on the txids the coordinator's rule lets a rewind go back to, saying
    what the rewind recomputes."""

    def test_a_committed_txid_undoes_the_later_commits_and_restarts_those_in_flight(self):
        v = view((8, DONE), (9, PROC), last=7)
        option = rewind_options.rewind_option(v, 1, 5)
        assert option == {
            "to_txid": 5,
            "through": 9,
            "span": "txids 5 … 9",
            "text": "txids 5 … 9 will be recomputed, in order: the commits of txids 5 … 7 are "
            "undone, and txids 8 … 9, in flight, start over.",
            "states": "Every state of p goes back to its value after txid 4.",
        }

    def test_the_last_committed_txid_with_nothing_in_flight(self):
        option = rewind_options.rewind_option(view(last=7), 1, 7)
        assert option is not None
        assert (option["span"], option["through"]) == ("txid 7", 7)
        assert (
            option["text"]
            == "txid 7 will be recomputed, in order: the commits of txid 7 are undone."
        )
        assert option["states"].endswith("its value after txid 6.")

    def test_the_oldest_uncommitted_txid_restarts_the_txids_in_flight_only(self):
        option = rewind_options.rewind_option(view((4, FAIL), (5, FAIL), last=3), 1, 4)
        assert option is not None
        assert (
            option["text"]
            == "txids 4 … 5 will be recomputed, in order: txids 4 … 5, in flight, start over."
        )
        one = rewind_options.rewind_option(view((4, PROC), last=3), 1, 4)
        assert one is not None and one["text"].endswith("txid 4, in flight, starts over.")

    def test_txid_1_goes_back_to_no_state_at_all(self):
        option = rewind_options.rewind_option(view((3, PROC), last=2), 1, 1)
        assert option is not None and option["span"] == "txids 1 … 3"
        assert option["states"] == "Every state of p goes back to its value before txid 1 (none)."

    @pytest.mark.parametrize(
        ("txid", "floor", "why"),
        [
            (4, 5, "below the floor: retention or missing undo records"),
            (9, 1, "after the oldest uncommitted txid: nothing committed to roll back"),
            (8, 1, "the oldest uncommitted txid, but not begun: nothing to recompute"),
        ],
    )
    def test_a_txid_the_rule_refuses_offers_no_rewind(self, txid, floor, why):
        assert rewind_options.rewind_option(view(last=7), floor, txid) is None, why

    def test_each_listed_txid_gets_its_option_or_none(self):
        v = view((6, FAIL), last=5)
        rows = [{"txid": t} for t in (6, 5, 4, 3, 2)]
        annotated = rewind_options.with_rewind_options(rows, v, 3)
        assert [r["rewind"] and r["rewind"]["span"] for r in annotated] == [
            "txid 6",
            "txids 5 … 6",
            "txids 4 … 6",
            "txids 3 … 6",
            None,  # below the floor
        ]

    def test_how_far_back_a_rewind_reaches(self):
        assert rewind_options.rewind_reach(view((6, PROC), last=5), 3) == {
            "floor": 3,
            "newest": 6,
            "text": "a rewind reaches back to txid 3",
        }
        assert rewind_options.rewind_reach(view(last=5), 9)["text"] == ""

    def test_a_user_who_may_not_edit_is_told_why(self):
        assert rewind_options.rewind_rights(True, "why") == {"allowed": True, "why_not": None}
        assert rewind_options.rewind_rights(False, "why") == {"allowed": False, "why_not": "why"}
