"""The one routine that applies a txid to its outputs: what it asks each state and sink, what it
records, and which staged files go once the transaction committed (the states and tables are
fakes here; tests/integration runs the commit and the fill on real ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_txn_provider.rules.vocabulary import SinkAction
from airflow_txn_provider.sinks.base import SINK_SPEC, SinkCommit, StagedFiles
from airflow_txn_provider.transactions import apply as apply_module
from airflow_txn_provider.transactions.apply import Outputs, SinkWrite, apply_txid, clean_up


@dataclass(frozen=True)
class Applied:
    staged_rows: int
    keys: int


@dataclass(eq=False)
class FakeState:
    name: str
    calls: list[tuple[int, int, int | None]] = field(default_factory=list)

    @property
    def output_key(self) -> str:
        return self.name

    def apply(self, conn: Any, txid: int, attempt: int, *, expected_rows: int | None) -> Applied:
        self.calls.append((txid, attempt, expected_rows))
        return Applied(expected_rows or 0, 1)


@dataclass(eq=False)
class FakeSink:
    name: str
    action: SinkAction = SinkAction.ADD
    commits: list[tuple[int, int, StagedFiles | None, int, int]] = field(default_factory=list)
    cleaned: list[tuple[int, StagedFiles | None]] = field(default_factory=list)
    fail_cleanup: bool = False

    @property
    def output_key(self) -> str:
        return f"lake:{self.name}"

    def commit(self, table, pipeline, txid, attempt, staged, *, rewound_through, committed_through):
        self.commits.append((txid, attempt, staged, rewound_through, committed_through))
        return SinkCommit(self.name, self.action.value, 7, staged.rows if staged else 0)

    def to_spec(self) -> dict[str, Any]:
        return {"kind": "fake", "name": self.name}

    def cleanup(self, pipeline: str, txid: int, committed: StagedFiles | None) -> int:
        if self.fail_cleanup:
            raise OSError("store out of reach")
        self.cleaned.append((txid, committed))
        return 1


class Files(StagedFiles):
    discarded = False

    def discard(self) -> None:
        object.__setattr__(self, "discarded", True)


@pytest.fixture
def patches(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, dict[str, Any]]]:
    """The output patches :func:`apply_txid` writes, per txid: ``(attempt, patch)``."""
    written: dict[int, tuple[int, dict[str, Any]]] = {}

    class Rows:
        def __init__(self, conn: Any, pipeline: str, txid: int) -> None:
            self.txid = txid

        def patch_output(self, attempt: int, patch: dict[str, Any]) -> None:
            written[self.txid] = (attempt, patch)

    monkeypatch.setattr(apply_module, "TxidRows", Rows)
    return written


def files(directory: str) -> Files:
    return Files(directory, (("part-0.parquet", 100, 5),))


def outputs(*sinks: FakeSink, states: tuple[FakeState, ...] = ()) -> Outputs:
    return Outputs("p", list(states), list(sinks), {s: object() for s in sinks})  # type: ignore[misc]


def test_states_apply_the_attempt_staged_and_check_the_count_given_by_name(patches):
    counts, words = FakeState("counts"), FakeState("words")
    done = apply_txid(
        None,  # type: ignore[arg-type]
        outputs(states=(counts, words)),
        3,
        2,
        rows={"counts": 10, "words": None},
        files={},
        staged_attempt=0,
    )
    assert counts.calls == [(3, 0, 10)] and words.calls == [(3, 0, None)]
    assert done.details == {
        "counts": {"staged_rows": 10, "keys": 1},
        "words": {"staged_rows": 0, "keys": 1},
    }
    assert 3 not in patches  # nothing of a sink to record


def test_a_live_commit_records_the_files_and_keeps_them_even_when_the_table_held_the_txid(patches):
    added, held = FakeSink("added"), FakeSink("held", SinkAction.ALREADY_IN_TABLE)
    given = {"added": files("/s/a"), "held": files("/s/h")}
    done = apply_txid(
        None,  # type: ignore[arg-type]
        outputs(added, held),
        4,
        2,
        rows={},
        files=given,
        rewound_through=3,
    )
    assert added.commits == [(4, 2, given["added"], 3, 0)]
    attempt, patch = patches[4]
    assert attempt == 2
    for sink in (added, held):
        assert patch[sink.output_key]["directory"] == given[sink.name].directory
        assert patch[sink.output_key][SINK_SPEC] == sink.to_spec()
        assert patch[sink.output_key]["commit"]["version"] == 7
    # the table references this attempt's files either way: every other directory goes
    assert all(w.kept for w in done.writes)
    clean_up("p", done.writes)
    assert added.cleaned == [(4, given["added"])] and held.cleaned == [(4, given["held"])]


def test_a_fill_whose_earlier_try_committed_the_txid_leaves_that_tries_files_alone(patches):
    computed, staged = (
        FakeSink("c", SinkAction.ALREADY_IN_TABLE),
        FakeSink("s", SinkAction.ALREADY_IN_TABLE),
    )
    fresh, live = files("/s/fill"), files("/s/live")
    first = apply_txid(
        None,  # type: ignore[arg-type]
        outputs(computed),
        5,
        1,
        rows={},
        files={"c": fresh},
        fill=True,
        computed=True,
        committed_through=9,
    )
    # the table references the earlier try's files, not these: not recorded, discarded
    assert "directory" not in patches[5][1][computed.output_key]
    second = apply_txid(
        None,  # type: ignore[arg-type]
        outputs(staged),
        6,
        1,
        rows={},
        files={"s": live},
        fill=True,
        committed_through=9,
    )
    assert patches[6][1][staged.output_key]["directory"] == "/s/live"
    assert computed.commits[0][4] == 9
    clean_up("p", first.writes + second.writes)
    assert fresh.discarded and not live.discarded  # the live processing's files are left alone
    assert computed.cleaned == [] and staged.cleaned == []


def test_a_fill_that_commits_the_txid_now_keeps_its_files_only(patches):
    sink = FakeSink("c")
    fresh = files("/s/fill")
    done = apply_txid(
        None,  # type: ignore[arg-type]
        outputs(sink),
        5,
        1,
        rows={},
        files={"c": fresh},
        fill=True,
        computed=True,
    )
    assert patches[5][1][sink.output_key]["directory"] == "/s/fill"
    clean_up("p", done.writes)
    assert sink.cleaned == [(5, fresh)] and not fresh.discarded


def test_a_cleanup_that_fails_is_logged_and_the_rest_still_cleaned(caplog):
    broken, fine = FakeSink("broken", fail_cleanup=True), FakeSink("fine")
    clean_up("p", [SinkWrite(broken, 1, None), SinkWrite(fine, 1, None)])  # type: ignore[arg-type]
    assert fine.cleaned == [(1, None)]
    assert "sink=broken cleanup: store out of reach" in caplog.text


def test_only_selects_outputs_by_name_and_keeps_the_open_tables():
    a, b = FakeSink("a"), FakeSink("b")
    state = FakeState("s")
    both = outputs(a, b, states=(state,))
    some = both.only({"b", "s"})
    assert some.sinks == [b] and some.states == [state] and some.tables is both.tables
