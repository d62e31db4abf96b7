"""The chaos tiers' shared report counts re-emissions, and a run without a fault must have none."""

from __future__ import annotations

from types import SimpleNamespace

from chaos.report import NO_FAULT, FaultResult, format_table, reemissions


def test_reemissions_are_the_attempts_beyond_each_txids_first():
    txids = [SimpleNamespace(attempt=a) for a in (1, 3, 1, 2)]
    assert reemissions(txids) == 3
    assert reemissions([]) == 0


def test_a_run_without_a_fault_fails_if_it_reemitted_anything():
    clean = FaultResult(NO_FAULT, 1, True, 0.0, 0, 0, reemitted=0)
    spurious = FaultResult(NO_FAULT, 2, True, 0.0, 0, 0, reemitted=1)
    faulted = FaultResult("kill_processing", 3, True, 4.0, 0, 0, reemitted=2)
    assert clean.ok and not spurious.ok and faulted.ok  # a fault may cost replays
    table = format_table([clean, spurious, faulted])
    assert "re-emitted" in table.splitlines()[0]
    assert " 1 (max 1) |" in table and " 2 (max 2) |" in table and " 3 (max 2) |" in table
