"""The fill's chaos faults, CI subset: one fixed-seed run of chaos/fill.py.

An output filled from history while the live pipeline commits in a thread; the fill's process
(a real child, its own process group) SIGKILLed after its first step and started again, the
log's Postgres (a server of the test's own) crashed after its third step and recovered. The live
pipeline loses and doubles nothing; the filled states equal their truth computed in plain Python.
``python chaos/fill.py --seed 2026 --runs 1`` replays it; ``make chaos-fill`` runs more seeds.
"""

from __future__ import annotations

import pytest

from chaos.fill import BOUND, FAULTS, plan_run, run_suite
from txn_testing.postgres import EmbeddedPostgres

pytestmark = pytest.mark.integration

SEED = 2026


@pytest.mark.timeout(BOUND + 120)  # the run's own bound reports first, with what it saw
def test_a_fill_killed_and_its_postgres_crashed_ends_exact_beside_live_commits(
    connect_server, tmp_path
):
    plan = plan_run(SEED)
    print(f"seed {SEED}: {plan}")
    assert {kind for kind, _ in plan.faults} == set(FAULTS)  # the seed draws both faults
    with EmbeddedPostgres(durable=True) as pg:
        [result] = run_suite(1, SEED, FAULTS, pg, connect_server.url, tmp_path)
    assert result.ok, result
    assert (result.lost, result.doubled, result.fill_exact) == (0, 0, True)
    assert result.fill_starts >= 2  # the kill's retry started another fill process
