"""The health rule: a pipeline with txids waiting and no progress for ``stall_after`` seconds is
stalled; one with nothing waiting is idle; lags and ages as the endpoint reports them."""

from __future__ import annotations

from datetime import timedelta

from airflow_txn_provider.log.health import Health, health_of
from tests.unit.builders import DONE, FAIL, NOW, PROC, view


def ago(seconds: float):
    return NOW - timedelta(seconds=seconds)


def test_nothing_waiting_is_idle_however_old_the_last_commit():
    h = health_of(view(last=7), last_commit_at=ago(86_400), pending_since=None, now=NOW)
    assert h.status is Health.IDLE
    assert (h.last_committed, h.newest_txid, h.lag_begun, h.lag_processed) == (7, 7, 0, 0)
    assert h.last_commit_age == 86_400 and h.stalled_for is None


def test_waiting_txids_are_ok_until_nothing_moved_for_stall_after():
    v = view((8, 1, DONE), (9, 1, PROC), (10, 1, DONE), last=7)
    recent = health_of(v, last_commit_at=ago(30), pending_since=ago(20), now=NOW, stall_after=60)
    assert recent.status is Health.OK and recent.stalled_for == 20
    assert (recent.lag_begun, recent.lag_processed, recent.newest_txid) == (3, 3, 10)
    stuck = health_of(v, last_commit_at=ago(300), pending_since=ago(200), now=NOW, stall_after=60)
    assert stuck.status is Health.STALLED and stuck.stalled_for == 200


def test_a_pipeline_idle_for_long_is_not_stalled_by_its_first_new_txid():
    # an hour without data, then a txid begins: progress is measured from its begin
    h = health_of(
        view((8, 1, PROC), last=7), last_commit_at=ago(3600), pending_since=ago(5), now=NOW
    )
    assert h.status is Health.OK and h.stalled_for == 5 and h.last_commit_age == 3600


def test_a_poison_batch_the_sensor_stopped_at_stalls_and_is_named():
    v = view((4, 3, FAIL), (5, 2, FAIL), last=3)
    h = health_of(v, last_commit_at=ago(900), pending_since=ago(800), now=NOW)
    assert h.status is Health.STALLED and h.oldest_failed == 4
    assert h.to_json()["status"] == "stalled"


def test_a_first_txid_waiting_without_any_commit():
    h = health_of(view((1, 1, PROC)), last_commit_at=None, pending_since=ago(700), now=NOW)
    assert h.status is Health.STALLED and h.last_commit_age is None


def test_a_txid_past_its_lease_that_nobody_expired_stalls_within_stuck_after():
    from airflow_txn_provider.log.health import STUCK_AFTER
    from tests.unit.builders import leased

    def past(seconds):
        v = leased(((8, 1, PROC, -seconds), (9, 1, DONE, None)), last=7)
        return health_of(v, last_commit_at=ago(60), pending_since=ago(50), now=NOW)

    assert past(STUCK_AFTER - 1).status is Health.OK  # its failure sensor's poll comes first
    h = past(STUCK_AFTER + 1)
    assert h.status is Health.STALLED
    assert h.reason is not None and "txid 8 attempt 1 is processing" in h.reason
    assert "past its lease" in h.reason


def test_run_trouble_stalls_once_it_lasted_stuck_after_and_says_what():
    from airflow_txn_provider.log.health import STUCK_AFTER

    v = view(last=7)  # nothing in flight: the txid's run was never created
    trouble = "txid 8's run cannot be created: run 'manual__x' holds its logical date"
    fresh = health_of(
        v, last_commit_at=ago(5), pending_since=None, now=NOW, run_trouble=(trouble, ago(5))
    )
    assert fresh.status is Health.IDLE
    old = health_of(
        v,
        last_commit_at=ago(5),
        pending_since=None,
        now=NOW,
        run_trouble=(trouble, ago(STUCK_AFTER + 1)),
    )
    assert old.status is Health.STALLED and old.reason == trouble


def test_a_long_stall_says_so():
    v = view((8, 1, DONE), last=7)
    h = health_of(v, last_commit_at=ago(900), pending_since=ago(800), now=NOW, stall_after=60)
    assert h.status is Health.STALLED and h.reason == "nothing has moved for 800 s while txids wait"
