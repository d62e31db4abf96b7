"""The fast chaos tier's commit-point faults land even when a run commits faster than their delay.

A ``kill_backend`` inside a commit is due ``delay`` seconds after its worker started; a run whose
txids all commit sooner would end with it never injected (the CI subset then failed on a fast
moment of the machine). At the commit of the run's last txid it fires all the same.
"""

from __future__ import annotations

import time
from collections import Counter

from chaos.fast import KILL_BACKEND, ChaosRun, FaultPlan, RunPlan


def _run(fault: FaultPlan, *, started_ago: float, opaque_txids: int = 3) -> ChaosRun:
    run = object.__new__(ChaosRun)  # the moment rule only: no Postgres, no workers
    run.plan = RunPlan(seed=1, txids=opaque_txids, max_pending=3, faults=(fault,))
    run.pending = [[fault, fault.spawn]]
    run.spawn_times = {1: time.monotonic() - started_ago}
    run.events = Counter()
    return run


def test_a_commit_fault_waits_for_its_moment_before_the_last_txid():
    fault = FaultPlan(KILL_BACKEND, spawn=1, delay=60.0, point="commit")
    run = _run(fault, started_ago=1.0)
    assert run._due_fault(KILL_BACKEND, "commit", txid=1) is None
    assert run._due_fault(KILL_BACKEND, "commit", txid=2) is None
    assert run._due_fault(KILL_BACKEND, "commit") is None


def test_a_commit_fault_fires_at_the_last_txid_before_its_moment():
    fault = FaultPlan(KILL_BACKEND, spawn=1, delay=60.0, point="commit")
    run = _run(fault, started_ago=1.0)
    assert run._due_fault(KILL_BACKEND, "commit", txid=3) == [fault, 1]
    assert run.events["kill_backend at the last commit (before its moment)"] == 1
    # another point's fault is not this one's
    assert run._due_fault(KILL_BACKEND, "processed", txid=3) is None


def test_a_fault_whose_worker_never_started_stays_pending_at_the_last_txid():
    fault = FaultPlan(KILL_BACKEND, spawn=2, delay=0.5, point="commit")
    run = _run(fault, started_ago=1.0)  # only spawn 1 started
    assert run._due_fault(KILL_BACKEND, "commit", txid=3) is None


def test_a_due_fault_fires_at_any_txid_without_an_event():
    fault = FaultPlan(KILL_BACKEND, spawn=1, delay=0.5, point="commit")
    run = _run(fault, started_ago=1.0)
    assert run._due_fault(KILL_BACKEND, "commit", txid=1) == [fault, 1]
    assert not run.events
