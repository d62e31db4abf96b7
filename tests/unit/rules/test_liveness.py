"""Which txids in flight wait for a task of their run, and when the waker looks at that run."""

from __future__ import annotations

from dataclasses import replace

from airflow_txn_provider.rules.liveness import Need, Overdue, needs
from tests.unit.builders import DONE, FAIL, PROC, leased, view


def test_a_failed_txid_and_a_lost_lease_wait_for_their_watch_a_ready_one_for_its_commit():
    v = leased(
        ((4, 1, DONE, None), (5, 2, FAIL, None), (6, 1, PROC, -1.0), (7, 1, PROC, 5.0)), last=3
    )
    assert needs(v) == {4: Need.COMMIT, 5: Need.WATCH, 6: Need.WATCH}


def test_nothing_waits_while_every_lease_is_kept_and_nothing_is_ready():
    assert needs(leased(((4, 1, PROC, 5.0), (5, 1, DONE, None)), last=3)) == {}
    assert needs(view(last=3)) == {}


def test_a_processed_txid_not_next_to_commit_waits_for_nothing():
    assert needs(leased(((4, 1, PROC, 5.0), (5, 1, DONE, None)), last=3)) == {}


def test_a_txid_is_looked_at_once_it_waited_past_the_grace_then_every_recheck():
    clock = Overdue(grace=10.0, recheck_every=30.0)
    v = view((4, 1, FAIL), last=3)
    assert clock.update(v, now=0.0) == []
    assert clock.update(v, now=9.9) == []
    looked = clock.update(v, now=10.0)
    assert [(rec.txid, need) for rec, need in looked] == [(4, Need.WATCH)]
    assert clock.update(v, now=20.0) == []  # looked at 10 s ago
    assert [rec.txid for rec, _ in clock.update(v, now=40.0)] == [4]


def test_a_new_attempt_or_status_starts_the_grace_again():
    clock = Overdue(grace=10.0, recheck_every=30.0)
    clock.update(view((4, 1, FAIL), last=3), now=0.0)
    # replayed, then failed again at once: a new attempt, a new wait
    assert clock.update(view((4, 2, FAIL), last=3), now=15.0) == []
    assert [rec.attempt for rec, _ in clock.update(view((4, 2, FAIL), last=3), now=25.0)] == [2]


def test_a_txid_that_moved_on_is_forgotten():
    clock = Overdue(grace=10.0, recheck_every=30.0)
    clock.update(view((4, 1, FAIL), last=3), now=0.0)
    assert clock.update(view(last=4), now=20.0) == []
    assert clock.update(view((4, 1, FAIL), last=3), now=21.0) == []  # as if new: grace again


def test_a_record_keeps_its_need_only_while_its_lease_is_lost():
    v = leased(((4, 1, PROC, -1.0),), last=3)
    assert needs(v) == {4: Need.WATCH}
    renewed = replace(
        v, in_flight=(replace(v.in_flight[0], lease_expires_at=v.now.replace(year=2030)),)
    )
    assert needs(renewed) == {}


def test_a_mark_by_hand_is_told_what_the_log_says_of_the_txid():
    from airflow_txn_provider.rules.liveness import mark_note

    v = view((4, 2, PROC), (5, 1, DONE), last=3)
    assert "txid 3 had committed already: nothing changes" in mark_note(v, 3, "failed")
    processing = mark_note(v, 4, "success")
    assert processing.startswith("Marked success by hand while txid 4 attempt 2 was processing")
    assert "re-queues" in processing
    assert "if its job still records its output, the txid commits in order" in processing
    assert "it still commits" in mark_note(v, 5, "failed")
    assert "before txid 6 began" in mark_note(v, 6, "success")
