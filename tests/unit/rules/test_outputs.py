"""The rules of a pipeline's outputs, with plain values (issue 46): an output added once txids
began needs a start choice, one removed while holding committed txids a keep-or-drop choice; a
commit leaves out an output complete from a later txid; what the page and the health endpoint
say of each (the declaration's choices on ``TxnPipeline`` and in its fingerprint:
tests/unit/transactions/test_declaration.py)."""

from __future__ import annotations

from datetime import datetime

import pytest

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.exceptions import (
    OutputDeclarationError,
    OutputRemovedError,
    OutputStartRequiredError,
    PipelineConfigError,
)
from airflow_txn_provider.rules.outputs import (
    DeclaredOutput,
    OutputRecord,
    completeness,
    plan_outputs,
    skipped_at_commit,
)
from airflow_txn_provider.rules.vocabulary import OutputKind, OutputRetirement, OutputStart

STATE, SINK = OutputKind.STATE, OutputKind.LAKE_SINK
KEEP, DROP, NEXT = OutputRetirement.KEEP, OutputRetirement.DROP, OutputStart.NEXT_TXID
WHEN = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def state(name, derived_from=None):
    return DeclaredOutput(name, STATE, derived_from)


def rec(name, since=1, kind=STATE, retired_after=None, retirement=None):
    retired_at = WHEN if retirement else None
    return OutputRecord(name, kind, since, None, WHEN, retired_at, retired_after, retirement)


def plan(declared, recorded=(), *, begun=3, last=3, **kw):
    return plan_outputs(
        "p",
        declared,
        {r.name: r for r in recorded},
        begun_through=begun,
        last_committed=last,
        **kw,
    )


# -- adding ---------------------------------------------------------------------------------------


def test_outputs_declared_before_any_txid_began_are_complete_from_txid_1_without_a_choice():
    got = plan([state("a"), DeclaredOutput("t", SINK)], begun=0, last=0)
    assert {n: (since, choice) for n, (_, since, choice) in got.new.items()} == {
        "a": (1, None),
        "t": (1, None),
    }


def test_an_output_added_once_txids_began_is_refused_naming_every_one_and_the_choice():
    with pytest.raises(OutputStartRequiredError) as err:
        plan([state("a"), state("b"), DeclaredOutput("t", SINK)], [rec("a")], begun=5, last=3)
    e = err.value
    assert isinstance(e, PipelineConfigError) and (e.pipeline, e.output) == ("p", "b, t")
    assert "state 'b', lake sink 't' added to a pipeline that has begun txids 1..5" in str(e)
    assert "(last committed 3): each would hold only the txids from 6 on" in str(e)
    assert "start={'b': 'next_txid', 't': 'next_txid'}" in str(e)
    assert "complete from txid 6" in str(e)


def test_started_at_the_next_txid_it_is_complete_from_the_txid_after_the_newest_begun():
    got = plan([state("a"), state("b")], [rec("a")], begun=5, last=3, start={"b": NEXT})
    assert {n: since for n, (_, since, _) in got.new.items()} == {"b": 6}
    assert got.retire == {}


def test_an_output_of_another_kind_under_a_recorded_name_is_refused():
    with pytest.raises(
        OutputDeclarationError, match="declared as a lake sink, the log records a state"
    ):
        plan([DeclaredOutput("a", SINK)], [rec("a")], start={"a": NEXT})


def test_a_kept_output_cannot_come_back_a_dropped_one_can():
    kept = rec("b", 2, retired_after=3, retirement=KEEP)
    with pytest.raises(OutputDeclarationError, match="retired after txid 3 with its tables kept"):
        plan([state("b")], [kept], start={"b": NEXT})
    dropped = rec("b", 2, retired_after=3, retirement=DROP)
    assert plan([state("b")], [dropped], start={"b": NEXT}).new["b"][1] == 4


def test_an_output_both_declared_and_retired_is_refused():
    with pytest.raises(OutputDeclarationError, match="both declared and retired"):
        plan([state("a")], [rec("a")], retired={"a": KEEP})


def test_a_derived_state_starts_with_the_state_it_counts_or_not_at_all():
    with pytest.raises(OutputDeclarationError, match="counts the keys of 'a'") as err:
        plan([state("a"), state("ab", "a")], [rec("a")], start={"ab": NEXT})
    assert err.value.output == "ab"
    both = plan([state("a"), state("ab", "a")], start={"a": NEXT, "ab": NEXT})
    assert {n: since for n, (_, since, _) in both.new.items()} == {"a": 4, "ab": 4}
    assert plan([state("a"), state("ab", "a")], [rec("a")], begun=0, last=0).new["ab"][1] == 1


# -- removing -------------------------------------------------------------------------------------


def test_a_removed_output_holding_committed_txids_needs_keep_or_drop():
    with pytest.raises(OutputRemovedError) as err:
        plan([state("a")], [rec("a"), rec("b", 2)])
    assert err.value.output == "b"
    assert "retired={'b': 'keep'}" in str(err.value) and "{'b': 'drop'}" in str(err.value)
    for choice in (KEEP, DROP):
        assert plan([state("a")], [rec("a"), rec("b", 2)], retired={"b": choice}).retire == {
            "b": choice
        }


def test_a_removed_output_that_holds_nothing_goes_without_asking_a_lake_table_untouched():
    recorded = [rec("a"), rec("b", 4), rec("t", 4, SINK)]
    got = plan([state("a")], recorded, begun=3, last=3)
    assert got.retire == {"b": DROP, "t": KEEP}


def test_the_provider_never_drops_a_lake_table():
    with pytest.raises(OutputDeclarationError, match="never drops a lake table"):
        plan([], [rec("t", 1, SINK)], retired={"t": DROP})


def test_kept_tables_may_be_dropped_later_and_a_retirement_is_not_repeated():
    kept = rec("b", 1, retired_after=3, retirement=KEEP)
    assert plan([], [kept], retired={"b": DROP}).retire == {"b": DROP}
    assert plan([], [kept], retired={"b": KEEP}).retire == {}
    assert plan([], [rec("b", 1, retired_after=3, retirement=DROP)]).retire == {}


def test_a_state_cannot_be_retired_while_a_declared_state_derives_from_it():
    with pytest.raises(OutputDeclarationError, match="'ab' still derive from it"):
        plan([state("ab", "a")], [rec("a"), rec("ab")], retired={"a": KEEP})


def test_a_state_created_by_itself_removes_nothing():
    got = plan([state("c")], [rec("a"), rec("b")], begun=0, last=0, removals=False)
    assert got.retire == {} and set(got.new) == {"c"}


# -- committing -----------------------------------------------------------------------------------


def test_a_commit_leaves_out_outputs_complete_from_a_later_txid():
    recorded = {"a": rec("a"), "b": rec("b", 5), "old": rec("old", None)}
    given = [state("a"), state("b"), state("old")]
    assert skipped_at_commit("p", 4, 1, given, recorded) == ({"b": "complete from txid 5"}, [])
    assert skipped_at_commit("p", 5, 1, given, recorded) == ({}, [])


def test_an_output_a_commit_names_for_the_first_time_is_complete_from_1_only_at_txid_1():
    sink = DeclaredOutput("t", SINK)
    assert skipped_at_commit("p", 1, 1, [sink], {}) == ({}, [sink])
    with pytest.raises(OutputStartRequiredError, match="'t' was never declared") as err:
        skipped_at_commit("p", 2, 3, [sink], {})
    assert (err.value.pipeline, err.value.txid, err.value.attempt) == ("p", 2, 3)
    retired = {"t": rec("t", 1, SINK, retired_after=1, retirement=KEEP)}
    with pytest.raises(OutputStartRequiredError, match="'t' was retired"):
        skipped_at_commit("p", 1, 1, [sink], retired)


# -- what the page and the health endpoint say -------------------------------------------------


@pytest.mark.parametrize(
    ("record", "sentence", "partial"),
    [
        (rec("a"), "complete from txid 1", False),
        (rec("b", 812), "complete from txid 812 (txids 1..811 are not in it)", True),
        (
            rec("c", None),
            "complete from: not recorded (declared by an earlier version while it ran)",
            None,
        ),
        (
            rec("d", 1, retired_after=40, retirement=KEEP),
            "retired after txid 40 (tables kept); was complete from txid 1",
            False,
        ),
        (
            rec("e", 3, SINK, retired_after=9, retirement=KEEP),
            "retired after txid 9 (tables kept); was complete from txid 3 "
            "(txids 1..2 are not in it)",
            True,
        ),
    ],
)
def test_every_output_says_from_which_txid_it_is_complete(record, sentence, partial):
    said = completeness(record)
    assert said["complete"] == sentence and said["partial"] is partial
    assert said["complete_from_txid"] == record.complete_from_txid
    assert said["retired"] is (record.retirement is not None)
    assert said["declared_at"] == "2026-11-23T12:00:00+00:00"
