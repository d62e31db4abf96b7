"""The rewind's chaos fault, CI subset: a few fixed-seed runs of chaos/kill_rewind.py.

The process running a rewind is SIGKILLed at seeded steps (a real child process, its own process
group; a real Postgres; real Delta tables). The first three of seed 1's six runs kill it inside
the log's transaction, at the log's commit, and in the table step that follows (a table left
ahead of the log): each time the log and the states are either as before or exactly rewound,
never a mix, and after healing every state and table equals ground truth. ``python
chaos/kill_rewind.py --seed 1 --runs 6`` replays them; ``make chaos-rewind`` runs the whole fault
on both table formats.
"""

from __future__ import annotations

import io

import pytest

from chaos.kill_rewind import run_suite
from chaos.report import print_table

pytestmark = pytest.mark.integration

SEED = 1
RUNS = 6


def test_a_rewind_killed_at_seeded_steps_leaves_no_mix_and_heals(postgres, tmp_path):
    print(f"seed {SEED}, {RUNS} runs")
    results = run_suite(RUNS, SEED, "delta", postgres.url, tmp_path)
    table = io.StringIO()
    print_table(results, title=f"kill_rewind (delta), seed {SEED}", file=table)
    print(table.getvalue())
    assert all(r.ok for r in results), table.getvalue()
    phases = {r.fault for r in results}
    for stage in ("the log's transaction", "the log's commit", "the table step"):
        assert any(stage in p for p in phases), (stage, phases)
