"""compat/airflow.py: the Airflow version differences behave alike on every version (`make
test-matrix` runs this on each cell: Python 3.10 and 3.13, Airflow 3.1 and 3.3, PySpark 3.5 and
4.3)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from airflow_txn_provider.compat import airflow as compat_airflow


@pytest.mark.parametrize("threads", [True, False])
def test_a_triggers_blocking_call_runs_in_a_thread_only_where_airflow_allows_it(
    monkeypatch, threads
):
    monkeypatch.setattr(compat_airflow, "SUPERVISOR_COMMS_THREAD_SAFE", threads)

    async def main() -> tuple[int, int]:
        return threading.get_ident(), await compat_airflow.run_blocking(threading.get_ident)

    loop_thread, ran_in = asyncio.run(main())
    assert (ran_in != loop_thread) is threads


def test_the_version_flags_follow_the_installed_airflow():
    import airflow

    minor = tuple(int(x) for x in airflow.__version__.split(".")[:2])
    assert compat_airflow.AIRFLOW_V_3_3_PLUS is (minor >= (3, 3))
    assert compat_airflow.STARTS_FROM_TRIGGER is compat_airflow.AIRFLOW_V_3_3_PLUS
    assert compat_airflow.CLEAR_TAKES_NOTE is compat_airflow.AIRFLOW_V_3_3_PLUS
    # the task exceptions are the ones Airflow's task runner catches
    from airflow.exceptions import AirflowFailException

    assert issubclass(compat_airflow.AirflowFailException, AirflowFailException) or issubclass(
        AirflowFailException, compat_airflow.AirflowFailException
    )


def test_the_stats_client_sends_and_a_legacy_name_is_valid():
    stats = compat_airflow.stats()
    assert callable(stats.incr) and callable(stats.gauge) and callable(stats.timing)
    name = compat_airflow.legacy_stat_name(stats, "txn.lag.begun.orders")
    assert name == "txn.lag.begun.orders"


@pytest.mark.parametrize("takes_note", [True, False])
def test_a_clear_sends_its_note_only_to_an_airflow_that_takes_one(monkeypatch, takes_note):
    from airflow_txn_provider.hooks import airflow_api

    monkeypatch.setattr(airflow_api, "CLEAR_TAKES_NOTE", takes_note)
    sent: list[dict] = []

    def request(method, path, **kwargs):
        sent.append(kwargs["json"])
        return {"task_instances": [{"dag_run_id": "txid-000003", "task_id": "commit"}]}

    hook = airflow_api.AirflowApiHook()
    monkeypatch.setattr(hook, "request", request)
    cleared = hook.clear_task_instances("d", ["commit"], run_id="txid-000003", note="re-queued")
    assert cleared == ["txid-000003: commit"]
    assert ("note" in sent[0]) is takes_note  # 3.1 and 3.2 answer 422 to an unknown field


@pytest.mark.skipif(not compat_airflow.TASKS_CREATE_RUNS, reason="below Airflow 3.3: REST")
@pytest.mark.parametrize("answer", ["made", "exists", "refused"])
def test_a_task_asks_its_supervisor_for_a_txid_run(monkeypatch, answer):
    from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun

    from airflow_txn_provider.hooks.airflow_api import create_txid_run_from_task
    from airflow_txn_provider.timetables import txid_logical_date, txid_run_id

    sent: list[TriggerDagRun] = []
    answers = {
        "made": None,
        "exists": ErrorResponse(error=ErrorType.DAGRUN_ALREADY_EXISTS),
        "refused": ErrorResponse(error=ErrorType.API_SERVER_ERROR, detail={"status_code": 400}),
    }

    class Comms:
        def send(self, msg):
            sent.append(msg)
            return answers[answer]

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)
    if answer == "refused":
        with pytest.raises(AirflowRuntimeError, match="400"):
            create_txid_run_from_task("words", 7)
    else:
        assert create_txid_run_from_task("words", 7) is (answer == "made")
    (msg,) = sent
    assert (msg.dag_id, msg.run_id, msg.logical_date) == (
        "words",
        txid_run_id(7),
        txid_logical_date(7),
    )
    assert msg.run_after is not None and msg.run_after.tzinfo is not None
