"""The waker: which new txid's run is due (a pure rule) and its loop, on a fake log, source and
REST API (the real ones are the integration tier's: every test on a real Airflow runs it)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest

from airflow_txn_provider.rules.config import RUNS_AHEAD
from airflow_txn_provider.rules.coordinator import plan_begin
from airflow_txn_provider.rules.exceptions import SourceLogChangedError
from airflow_txn_provider.rules.vocabulary import BeginAction
from airflow_txn_provider.rules.waiting import (
    new_txid_due,
    previous_unbegun,
    runs_ahead,
    runs_to_make,
)
from airflow_txn_provider.triggers import waker as waker_module
from airflow_txn_provider.triggers.waker import (
    TxnWakerTrigger,
    make_runs_ahead,
    source_has_data,
)
from tests.unit.builders import DONE, FAIL, PROC, view


@pytest.mark.parametrize(
    ("records", "last", "max_pending", "due"),
    [
        ((), 0, 4, 1),  # a new pipeline with no txid yet
        ((), 7, 4, 8),  # idle after txid 7
        (((8, 1, PROC),), 7, 4, 9),  # the window has room
        (((8, 1, PROC), (9, 1, DONE)), 7, 2, None),  # the window is full
        (((8, 2, FAIL), (9, 1, FAIL)), 7, 4, None),  # failed txids replay in their own runs
        (((8, 1, DONE), (9, 1, PROC), (10, 1, PROC)), 7, 4, 11),
    ],
)
def test_the_next_new_txid_is_due_while_the_window_has_room(records, last, max_pending, due):
    assert new_txid_due(view(*records, last=last, max_pending=max_pending)) == due


def test_a_pipeline_not_in_the_log_yet_is_due_its_first_txid():
    assert new_txid_due(None) == 1


STATUSES = st.sampled_from([PROC, DONE, FAIL])


@hypothesis.given(
    last=st.integers(0, 50),
    statuses=st.lists(STATUSES, max_size=8),
    max_pending=st.integers(1, 8),
)
def test_a_due_txid_is_one_the_coordinator_would_begin_new_now(last, statuses, max_pending):
    records = [(last + 1 + i, 1, s) for i, s in enumerate(statuses)]
    v = view(*records, last=last, max_pending=max_pending)
    due = new_txid_due(v)
    if due is None:  # nothing new may begin: the window is full, or a failed txid comes first
        assert v.next_new_txid not in v.window or any(s is FAIL for s in statuses)
    else:
        assert due == v.next_new_txid and plan_begin(v, due).action is BeginAction.NEW


class _Stop(Exception):
    """Ends the loop after the polls a test wants."""


class Fake:
    """The waker's world: a log whose view the test sets, a source that has data from a given
    poll on, and an API that records the runs created (False for one that existed)."""

    def __init__(self, polls: int, *, view=None, data_from: int = 0, source_error=None):
        self.polls, self.view, self.data_from = polls, view, data_from
        self.source_error = source_error
        self.poll = 0
        self.asked: list[tuple[int, object]] = []
        self.created: list[int] = []
        self.view_reads = 0

    async def read_view(self):
        self.view_reads += 1
        return self.view

    async def has_data(self, txid, prev):
        self.asked.append((txid, prev))
        if self.source_error is not None:
            raise self.source_error
        return self.poll >= self.data_from

    async def create_run(self, txid):
        existed = txid in self.created
        self.created.append(txid)
        return True, "its run exists" if existed else "created"

    async def sleep(self, seconds):
        self.poll += 1
        if self.poll >= self.polls:
            raise _Stop


def _waker(**kw):
    return TxnWakerTrigger(
        txn_log_conn_id="log",
        airflow_api_conn_id="api",
        pipeline="p",
        dag_id="p_dag",
        source={"class": "x:Y", "args": {}},
        **kw,
    )


def _run(fake: Fake, waker: TxnWakerTrigger | None = None) -> Fake:
    with pytest.raises(_Stop):
        waker = waker or _waker()
        asyncio.run(waker.wake(fake.read_view, fake.has_data, fake.create_run, fake.sleep))
    return fake


def test_an_idle_source_creates_no_run_and_the_log_is_read_rarely():
    fake = _run(Fake(polls=20, view=view(last=3), data_from=10**9))
    assert fake.created == []
    # the source is asked on every poll, from where txid 3 ended
    assert fake.asked == [(4, {"end": 30})] * 20
    assert fake.view_reads == 1  # idle: the log again only every QUIET_LOG_EVERY seconds


def test_new_data_creates_the_due_txids_run_once():
    fake = _run(Fake(polls=10, view=view(last=3), data_from=4))
    assert fake.created == [4]  # once: the run is not asked for again while it starts
    assert len(fake.asked) == 5  # until data came, then not again for that txid


def test_a_run_that_did_not_begin_its_txid_is_asked_for_again_after_a_while(monkeypatch):
    monkeypatch.setattr(waker_module, "RECREATE_AFTER", 0.0)
    fake = _run(Fake(polls=3, view=view(last=3)))
    assert fake.created == [4, 4, 4]  # the API answers "exists" (409) to the second and third


def test_a_run_a_claim_made_ahead_is_not_asked_for_until_it_fails_to_begin(monkeypatch):
    made_ahead = view((4, 1, PROC), last=3, runs_made_through=7)
    fake = _run(Fake(polls=5, view=made_ahead))
    assert fake.created == [] and fake.asked == []  # no 409 per txid: the claim made it
    monkeypatch.setattr(waker_module, "RECREATE_AFTER", 0.0)
    fake = _run(Fake(polls=2, view=made_ahead))
    assert set(fake.created) == {5}  # not begun a while later: asked for (409 if it exists)


def test_a_new_pipeline_gets_its_first_txids_run():
    fake = _run(Fake(polls=2, view=None))
    assert fake.created == [1] and fake.asked == [(1, None)]


def test_a_busy_pipeline_reads_its_log_every_poll_and_fills_the_window():
    fake = Fake(polls=4, view=view((4, 1, PROC), last=3, max_pending=2))
    _run(fake)
    assert fake.created == [5] and fake.asked[0] == (5, {"end": 40})
    assert fake.view_reads >= 4
    full = _run(Fake(polls=4, view=view((4, 1, PROC), (5, 1, PROC), last=3, max_pending=2)))
    assert full.created == [] and full.asked == []  # a full window asks nothing of the source


def _logged(caplog, capsys) -> str:
    """What the trigger logged (Airflow's structlog writes to stdout, or to logging)."""
    return caplog.text + capsys.readouterr().out


def test_a_source_that_cannot_answer_gets_its_run_created_so_the_claim_reports_it(caplog, capsys):
    fake = _run(Fake(polls=2, view=view(last=3), source_error=FileNotFoundError("/data/gone")))
    assert fake.created == [4]
    logged = _logged(caplog, capsys)
    assert "/data/gone" in logged and "pipeline=p" in logged


def test_trouble_with_the_log_is_reported_and_waited_out_never_raised(caplog, capsys):
    class Broken(Fake):
        async def read_view(self):
            self.view_reads += 1
            if self.view_reads <= 2:
                raise ConnectionError("log down")
            return self.view

    fake = _run(Broken(polls=5, view=view(last=3)))
    assert fake.created == [4]
    # reported once, not on every failed poll
    assert _logged(caplog, capsys).count("log down") == 1


def test_the_waker_refuses_a_non_positive_poll_interval():
    with pytest.raises(ValueError, match="poll_interval"):
        _waker(poll_interval=0)


def test_source_has_data_asks_as_a_begin_would():
    class Source:
        prefetched = False

        def prefetch(self):
            self.prefetched = True

        def initialize_transaction(self, txid, prev):
            return None if prev == {"end": 10} else {"end": 10}

    src = Source()
    assert source_has_data(src, 2, None) and src.prefetched
    assert not source_has_data(src, 3, {"end": 10})


class Batches:
    """A source with data up to offset ``end``, batches of 10."""

    def __init__(self, end: int) -> None:
        self.end, self.asked = end, []

    def prefetch(self):
        pass

    def initialize_transaction(self, txid, prev):
        self.asked.append((txid, prev))
        start = (prev or {"end": 0})["end"]
        return {"end": min(start + 10, self.end)} if start < self.end else None


def made_by_claim(v, source, *, wait_slots_free=lambda: RUNS_AHEAD, exists=()):
    made: list[int] = []

    def create(n):
        made.append(n)
        return n not in exists

    return make_runs_ahead(v, source, create, wait_slots_free=wait_slots_free), made


@pytest.mark.parametrize(
    ("records", "source_end", "made_through", "expected"),
    [
        # txid 4 began with data behind it: the window's txids 5-7 and 8-10, just past it
        (((4, 1, PROC),), 100, 0, [5, 6, 7, 8, 9, 10]),
        (((4, 1, PROC),), 60, 0, [5, 6]),  # data for two more batches: two runs
        (((4, 1, PROC),), 40, 0, []),  # txid 4 took everything there was: no run
        (((4, 1, PROC),), 100, 6, [7, 8, 9, 10]),  # 5 and 6 were made by an earlier claim
        (((4, 1, PROC), (5, 1, PROC)), 100, 10, []),  # every run it would make exists
    ],
)
def test_a_claim_makes_the_runs_of_the_window_its_source_has_data_for(
    records, source_end, made_through, expected
):
    v = view(*records, last=3, max_pending=4, runs_made_through=made_through)
    source = Batches(source_end)
    result, made = made_by_claim(v, source)
    assert result == made == expected
    if not runs_to_make(v):
        assert source.asked == []  # nothing to make: nothing asked of the source


def test_each_run_is_asked_for_from_the_batch_before_it_as_its_begin_would():
    v = view((4, 1, PROC), last=3, max_pending=3)
    source = Batches(100)
    made_by_claim(v, source)
    # the window's 5 and 6, and the RUNS_AHEAD (3) past it, 7-9
    assert source.asked == [(t, {"end": 10 * (t - 1)}) for t in range(5, 10)]


def test_a_run_that_exists_already_ends_the_runs_made_and_is_not_noted():
    # another claim made it, or a person's trigger holds its slot: the waker looks which
    v = view((4, 1, PROC), last=3, max_pending=2)
    result, made = made_by_claim(v, Batches(100), exists=(6,))
    assert made == [5, 6] and result == [5]


def test_a_claim_makes_the_runs_past_a_full_window_one_per_free_wait_slot():
    full = view((4, 1, PROC), (5, 1, PROC), last=3, max_pending=2)
    ahead = list(range(6, 6 + RUNS_AHEAD))  # they wait in their workers for txid 4's commit
    assert made_by_claim(full, Batches(100))[0] == ahead
    assert made_by_claim(full, Batches(100), wait_slots_free=lambda: 1)[0] == [6]
    assert made_by_claim(full, Batches(100), wait_slots_free=lambda: 0)[0] == []
    room = view((4, 1, PROC), last=3, max_pending=2)
    assert made_by_claim(room, Batches(100), wait_slots_free=lambda: 0)[0] == [5]
    asked: list[int] = []

    def slots() -> int:
        asked.append(1)
        return 2

    assert made_by_claim(room, Batches(100), wait_slots_free=slots)[0] == [5, 6, 7]
    assert asked == [1]  # asked once, when the first run past the window is reached


def test_no_run_is_made_ahead_while_a_failed_txid_waits_to_replay():
    v = view((4, 2, FAIL), (5, 1, PROC), last=3, max_pending=4)
    source = Batches(100)
    assert runs_to_make(v) == range(0)
    assert made_by_claim(v, source)[0] == []
    assert source.asked == []


@hypothesis.given(
    last=st.integers(0, 50),
    statuses=st.lists(st.sampled_from([PROC, DONE]), max_size=8),
    max_pending=st.integers(1, 8),
    made_ahead=st.integers(0, 10),
)
def test_runs_are_made_for_new_txids_the_window_admits_and_those_past_it(
    last, statuses, max_pending, made_ahead
):
    records = [(last + 1 + i, 1, s) for i, s in enumerate(statuses)]
    v = view(*records, last=last, max_pending=max_pending, runs_made_through=last + made_ahead)
    wanted = runs_to_make(v)
    for txid in wanted:
        assert txid >= v.next_new_txid and txid > v.runs_made_through
        # each begins new once the txids before it began, or waits for the window too
        assert txid in v.window or txid in runs_ahead(v)
    if wanted:  # never more runs than the DAG's max_active_runs
        assert len(v.in_flight) + len(wanted) <= max_pending + RUNS_AHEAD
        assert wanted.stop == v.window.stop + RUNS_AHEAD


def test_a_run_made_ahead_waits_only_for_the_first_begin_before_it():
    v = view((4, 1, PROC), last=3, max_pending=4)
    assert previous_unbegun(v, 6) and not previous_unbegun(v, 5)
    assert plan_begin(v, 6).action is BeginAction.WAIT_PREVIOUS
    replay = view((4, 2, FAIL), (5, 1, FAIL), last=3, max_pending=4)
    assert not previous_unbegun(replay, 5)  # a replay's wait is its trigger's, not the worker's


@hypothesis.given(
    last=st.integers(0, 50),
    statuses=st.lists(STATUSES, max_size=8),
    max_pending=st.integers(1, 8),
)
def test_the_runs_ahead_wait_for_the_window_and_the_begin_before_each(last, statuses, max_pending):
    hypothesis.assume(len(statuses) <= max_pending)  # nothing in flight past the window
    records = [(last + 1 + i, 1, s) for i, s in enumerate(statuses)]
    v = view(*records, last=last, max_pending=max_pending)
    ahead = runs_ahead(v)
    if not ahead:
        assert FAIL in statuses  # a failed txid replays first, in its own run
        return
    assert FAIL not in statuses and ahead == range(v.window.stop, v.window.stop + RUNS_AHEAD)
    for txid in ahead:
        action = plan_begin(v, txid).action
        if txid == v.next_new_txid:  # the window is full: it waits for the oldest commit
            assert action is BeginAction.WAIT_WINDOW and new_txid_due(v) is None
        else:  # the txid before it has not begun
            assert action is BeginAction.WAIT_PREVIOUS
    if ahead.start != v.next_new_txid:
        return
    # Once the oldest txid commits, the first is the txid the coordinator begins next, as a new
    # one, and the next runs ahead move along with the window.
    oldest = v.in_flight[0]
    moved = view(*records[1:], last=oldest.txid, max_pending=max_pending)
    assert plan_begin(moved, ahead.start).action is BeginAction.NEW
    assert runs_ahead(moved) == range(ahead.start + 1, ahead.stop + 1)


@pytest.mark.parametrize("thread_safe", [True, False])
def test_the_next_run_is_created_beside_the_claim_only_where_its_supervisor_takes_threads(
    monkeypatch, thread_safe
):
    # below Airflow 3.3 a task process's requests to its supervisor are not thread-safe: the
    # chain's connection look-ups beside the task's own (a Variable) hung both (matrix, 3.1)
    from types import SimpleNamespace

    from airflow_txn_provider.triggers import waker

    ran_in = []

    def make_runs_ahead(*args, **kwargs):
        ran_in.append(threading.current_thread())
        return [2]

    monkeypatch.setattr(waker, "SUPERVISOR_COMMS_THREAD_SAFE", thread_safe)
    monkeypatch.setattr(waker, "make_runs_ahead", make_runs_ahead)
    monkeypatch.setattr("airflow_txn_provider.triggers.waker.source_from_spec", lambda spec: spec)
    txn_pipeline = SimpleNamespace(
        name="p", airflow_api_conn_id="api", source=SimpleNamespace(to_spec=lambda: {})
    )
    noted = []
    log = SimpleNamespace(
        view=lambda name: None, note_runs_made=lambda *a: noted.append(a), engine=None
    )
    thread = waker.start_making_runs(txn_pipeline, "p", 1, log, logging.getLogger(__name__))
    if thread is not None:
        thread.join(10)
    assert len(ran_in) == 1 and noted == [("p", 2)]
    assert (thread is None) is (ran_in[0] is threading.current_thread()) is (not thread_safe)


@pytest.mark.parametrize("tasks_create_runs", [True, False])
def test_a_claim_makes_the_runs_through_its_supervisor_where_airflow_lets_it(
    monkeypatch, tasks_create_runs
):
    # from 3.3 a task asks its supervisor (no connection, HTTP client or token of its own)
    from types import SimpleNamespace

    from airflow_txn_provider.hooks import airflow_api
    from airflow_txn_provider.triggers import waker

    asked: list[tuple[str, str, int]] = []
    monkeypatch.setattr(
        waker,
        "create_txid_run_from_task",
        lambda dag_id, txid: asked.append(("supervisor", dag_id, txid)) or True,
    )
    monkeypatch.setattr(
        airflow_api.AirflowApiHook,
        "create_txid_run",
        lambda self, dag_id, txid: asked.append(("rest", dag_id, txid)) or True,
    )
    monkeypatch.setattr(waker, "TASKS_CREATE_RUNS", tasks_create_runs)
    monkeypatch.setattr(waker, "SUPERVISOR_COMMS_THREAD_SAFE", False)  # in this thread

    def make_runs_ahead(view, source, create, **kwargs):
        return [n for n in (2, 3) if create(n)]

    monkeypatch.setattr(waker, "make_runs_ahead", make_runs_ahead)
    monkeypatch.setattr("airflow_txn_provider.triggers.waker.source_from_spec", lambda spec: spec)
    txn_pipeline = SimpleNamespace(
        name="p", airflow_api_conn_id="api", source=SimpleNamespace(to_spec=lambda: {})
    )
    log = SimpleNamespace(view=lambda name: None, note_runs_made=lambda *a: None, engine=None)
    waker.start_making_runs(txn_pipeline, "words", 1, log, logging.getLogger(__name__))
    way = "supervisor" if tasks_create_runs else "rest"
    assert asked == [(way, "words", 2), (way, "words", 3)]


# -- the waker as the pipeline's liveness watch ------------------------------------------------


def test_a_txid_that_waits_past_the_grace_gets_its_run_kept_alive(monkeypatch):
    from airflow_txn_provider.rules.liveness import Need, Overdue

    monkeypatch.setattr(waker_module, "Overdue", lambda: Overdue(grace=0.0, recheck_every=1e9))
    kept = []

    async def keep(rec, need):
        kept.append((rec.txid, rec.attempt, need))
        return "restarted its watch"

    fake = Fake(polls=3, view=view((4, 1, FAIL), (5, 1, FAIL), last=3), data_from=10**9)
    with pytest.raises(_Stop):
        asyncio.run(
            _waker().wake(fake.read_view, fake.has_data, fake.create_run, fake.sleep, keep=keep)
        )
    assert kept == [(4, 1, Need.WATCH), (5, 1, Need.WATCH)]  # once each: then every recheck


def test_a_run_that_cannot_be_created_is_reported_asked_again_soon_and_cleared(monkeypatch):
    monkeypatch.setattr(waker_module, "RECREATE_AFTER", 1e9)
    monkeypatch.setattr(waker_module, "RETRY_HELD_AFTER", 0.0)  # asked again at once
    answers = iter([(False, "slot held by run 'manual__x'"), (True, "created")])
    reports: list[str | None] = []
    fake = Fake(polls=4, view=view(last=3))

    async def create_run(txid):
        fake.created.append(txid)
        return next(answers)

    async def report(trouble):
        reports.append(trouble)

    with pytest.raises(_Stop):
        asyncio.run(
            _waker().wake(
                fake.read_view, fake.has_data, create_run, fake.sleep, report_trouble=report
            )
        )
    assert fake.created == [4, 4]  # asked again without waiting RECREATE_AFTER
    assert reports == ["slot held by run 'manual__x'", None]


def test_a_source_that_cannot_say_is_the_pipelines_trouble_until_a_look_succeeds(monkeypatch):
    monkeypatch.setattr(waker_module, "RECREATE_AFTER", 0.0)  # the source is asked every poll
    refusal = SourceLogChangedError("words-0: another log", txid=4, partition="words-0")
    errors = iter([refusal, refusal, None, None])
    reports: list[str | None] = []
    fake = Fake(polls=4, view=view(last=3))

    async def has_data(txid, prev):
        error = next(errors)
        if error is not None:
            raise error
        return False  # answers again, with no data yet

    async def report(trouble):
        reports.append(trouble)

    with pytest.raises(_Stop):
        asyncio.run(
            _waker().wake(
                fake.read_view, has_data, fake.create_run, fake.sleep, report_trouble=report
            )
        )
    assert fake.created == [4, 4]  # its claim reports the error on the run too
    (said,) = [r for r in reports if r is not None]
    # named as a begin names it: the source knows no pipeline
    assert said.startswith(
        "txid 4: the source cannot say: SourceLogChangedError: pipeline=p txid=4 attempt=None: "
    )
    assert reports == [said, None]  # once while it refuses, cleared by the first answer


STORED_TRIGGERS = {
    "airflow_txn_provider.triggers.waker.TxnWakerTrigger",
    "airflow_txn_provider.triggers.fill.TxnFillDueTrigger",
    "airflow_txn_provider.triggers.txn_log.TxnLogTrigger",
}
"""Trigger class paths as Airflow stores them (``serialize()``'s first item) since 0.1."""


def import_string(classpath: str) -> Any:
    """The class at ``classpath``, loaded as the triggerer loads a stored trigger's."""
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_stored_trigger_class_path_still_resolves():
    for classpath in STORED_TRIGGERS:
        assert import_string(classpath).__name__ == classpath.rsplit(".", 1)[1]


def test_a_waker_stored_before_the_sources_moved_loads_its_source():
    """A waker deferred by an earlier version, its arguments through Airflow's own
    serialization as its trigger table keeps them, is rebuilt by the new version and its
    source spec (naming ``spark.parquet_source``) loads the source from ``sources/``."""
    from airflow.serialization.serialized_objects import BaseSerialization

    from airflow_txn_provider.sources.base import source_from_spec
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    stored = {
        "txn_log_conn_id": "txn_log",
        "airflow_api_conn_id": "airflow_api",
        "pipeline": "words",
        "dag_id": "txn_words",
        "source": {
            "class": "airflow_txn_provider.spark.parquet_source:PartitionedParquetSource",
            "args": {"path": "/data/words", "max_per_partition": 1000, "index_dir": None},
        },
        "poll_interval": 2.0,
    }
    kwargs = BaseSerialization.deserialize(BaseSerialization.serialize(stored))
    trigger = import_string("airflow_txn_provider.triggers.waker.TxnWakerTrigger")(**kwargs)
    source = source_from_spec(trigger.serialize()[1]["source"])
    assert source == PartitionedParquetSource("/data/words", max_per_partition=1000)
