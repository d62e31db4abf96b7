"""The chaos suite on a real Airflow: a fixed-seed list of runs (``CHAOS_FAULTS`` in
``tests/integration/conftest.py``), one of which CI runs (``CHAOS_IN_CI``) on the suite's shared
deployment, the others ``make test-scenarios`` on a deployment of their own (``make chaos`` runs
every fault, seeds drawn anew).

One fault per run, each on its own pipeline (scheduler with LocalExecutor, dag-processor,
triggerer, api-server, Spark Connect): a processing task SIGKILLed mid-job, a herd of cascades
(three txids fail, each re-queueing max_pending runs), the log's Postgres crashed for ~20 s, and
the scheduler SIGKILLed with its task processes. Each must heal with nobody touching anything,
commit every txid in order, and leave a state equal to word counts computed in plain Python. One
more run kills a processing task of a pipeline that also writes a Delta table
(``kill_processing@delta``): the table must hold each committed txid's word counts exactly once,
as of the log's last txid (``make chaos-lake`` runs every fault on Delta and on Iceberg). The last
run SIGKILLs a backend of the log's Postgres once a txid's output is recorded and before its
commit (``kill_log_backend``): crash recovery empties the UNLOGGED staging tables, and the txid
must replay, not commit an empty batch. The runs that crash a Postgres need durable servers of
their own: those of ``make test-scenarios``' deployment.
"""

from __future__ import annotations

import pytest

from chaos.on_airflow import run_plans, run_suite
from chaos.report import FaultResult, print_table
from tests.integration.conftest import CHAOS_FAULTS, CHAOS_IN_CI, CHAOS_SEED


def _check(results: list[FaultResult], only: tuple[str, ...]) -> None:
    print_table(results, title=f"chaos on Airflow (seed {CHAOS_SEED})")
    assert [r.fault for r in results] == list(only)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n".join(f"{r.fault} seed {r.seed}: {r.detail}" for r in failed)
    assert all(r.records_lost == 0 and r.records_doubled == 0 for r in results)


def test_a_real_airflow_heals_from_each_fault(shared_airflow):
    print(f"seed {CHAOS_SEED}")
    try:
        results = run_plans(shared_airflow.chaos, shared_airflow.chaos_plans)
    finally:  # the next tests of the deployment run beside no run of these pipelines
        for plan in shared_airflow.chaos_plans:
            shared_airflow.idle(plan.name)
    _check(results, CHAOS_IN_CI)


@pytest.mark.scenario
def test_a_real_airflow_heals_from_the_other_faults():
    print(f"seed {CHAOS_SEED}")
    only = tuple(f for f in CHAOS_FAULTS if f not in CHAOS_IN_CI)
    _check(run_suite(CHAOS_FAULTS, CHAOS_SEED, only=only), only)
