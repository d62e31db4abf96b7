"""The chaos suite on a real Airflow: a fixed-seed list of runs, one of which CI runs
(``IN_CI``), the others ``make test-scenarios`` (``make chaos`` runs every fault, seeds drawn anew).

One fault per run, each on its own pipeline of one deployment (scheduler with LocalExecutor,
dag-processor, triggerer, api-server, two durable Postgres servers, Spark Connect): a processing
task SIGKILLed mid-job, a herd of cascades (three txids fail, each re-queueing max_pending runs),
the log's Postgres crashed for ~20 s, and the scheduler SIGKILLed with its task processes. Each
must heal with nobody touching anything, commit every txid in order, and leave a state equal to
word counts computed in plain Python. One more run kills a processing task of a pipeline that
also writes a Delta table (``kill_processing@delta``): the table must hold each committed txid's
word counts exactly once, as of the log's last txid (``make chaos-lake`` runs every fault on
Delta and on Iceberg). The last run SIGKILLs a backend of the log's Postgres once a txid's output
is recorded and before its commit (``kill_log_backend``): crash recovery empties the UNLOGGED
staging tables, and the txid must replay, not commit an empty batch.
"""

from __future__ import annotations

import pytest

from chaos.on_airflow import run_suite
from chaos.report import print_table

SEED = 2026
FAULTS = [
    "kill_processing",
    "cascade_herd",
    "restart_log_postgres",
    "kill_scheduler",
    "kill_processing@delta",  # appended: the four runs above keep their seeds
    "kill_log_backend",  # appended too; its seed draws the "processed" moment (staged rows lost)
]
IN_CI = ("kill_processing",)
"""The run ``make test`` makes (with the seed it has in the whole list): a task process killed
(its txid fails, the later ones in flight with it, and the failure sensors re-queue them: a
cascade). The log's Postgres restarted and the backend kills (``kill_log_backend``: staged rows a
crash recovery empties) have CI runs without Airflow (``test_chaos_fast.py``); the other runs
are in ``make test-scenarios``."""


def _heals(only: tuple[str, ...]) -> None:
    print(f"seed {SEED}")
    # in a folder of its own: Postgres runs as user postgres
    results = run_suite(FAULTS, SEED, only=only)
    print_table(results, title=f"chaos on Airflow (seed {SEED})")
    assert [r.fault for r in results] == list(only)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n".join(f"{r.fault} seed {r.seed}: {r.detail}" for r in failed)
    assert all(r.records_lost == 0 and r.records_doubled == 0 for r in results)


def test_a_real_airflow_heals_from_each_fault():
    _heals(IN_CI)


@pytest.mark.scenario
def test_a_real_airflow_heals_from_the_other_faults():
    _heals(tuple(f for f in FAULTS if f not in IN_CI))
