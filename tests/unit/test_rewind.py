"""A rewind's Airflow side (rewind.py): the runs of every txid from the rewound one on restarted
through the REST API, each DAG paused meanwhile (the REST hook stood in for by a recorder)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rewind import restart_runs
from airflow_txn_provider.timetables import txid_logical_date
from airflow_txn_provider.transactions.rewind import RewindResult


class Api:
    """Records the calls ``restart_runs`` makes of :class:`AirflowApiHook`. ``paused``: the DAGs
    paused before; ``unfinished``: each DAG's queued and running runs; ``fail_clear``: its clear
    raises."""

    def __init__(self, paused=(), unfinished=None, fail_clear=False):
        self.paused = set(paused)
        self.unfinished = unfinished or {}
        self.fail_clear = fail_clear
        self.calls: list[tuple] = []

    def set_paused(self, dag_id, paused):
        was = dag_id in self.paused
        self.calls.append(("pause" if paused else "unpause", dag_id))
        if paused:
            self.paused.add(dag_id)
        else:
            self.paused.discard(dag_id)
        return was

    def unfinished_runs_from(self, dag_id, start):
        self.calls.append(("unfinished", dag_id, start))
        return self.unfinished.get(dag_id, [])

    def set_run_state(self, dag_id, run_id, state):
        self.calls.append(("state", dag_id, run_id, state))

    def task_ids(self, dag_id):
        return ["commit", f"process_{dag_id}"]

    def clear_task_instances(self, dag_id, task_ids, *, logical_dates, note, reset_dag_runs):
        self.calls.append(("clear", dag_id, task_ids, logical_dates, note, reset_dag_runs))
        if self.fail_clear:
            raise ConnectionError("the api-server went away")
        return [f"txid-000003: {t}" for t in task_ids]


def rewound(*txids, to=3):
    return RewindResult("p", to, 5, txids, {"s": {"restored": 1, "removed": 0}})


def test_a_rewind_that_rewound_no_txid_restarts_nothing():
    api = Api()
    assert restart_runs(api, ["a"], rewound()) == []
    assert api.calls == []


def test_every_run_from_the_txid_on_is_cleared_with_its_dag_paused_its_unfinished_runs_failed():
    api = Api(unfinished={"b": ["txid-000004"]})
    cleared = restart_runs(api, ["b", "a"], rewound(3, 4, 5))
    start = txid_logical_date(3)
    note = "rewound to txid 3: recomputed from it, in order"
    [a_clear] = [c for c in api.calls if c[:2] == ("clear", "a")]
    (_, _, tasks, (first, last), said, reset) = a_clear
    assert tasks == ["commit", "process_a"] and said == note and reset is True
    assert first == start and last > txid_logical_date(10**6)  # the runs made later too
    assert api.calls == [  # one DAG after another, in order of their ids
        ("pause", "a"),
        ("unfinished", "a", start),
        a_clear,
        ("unpause", "a"),
        ("pause", "b"),
        ("unfinished", "b", start),
        ("state", "b", "txid-000004", "failed"),  # its slot freed before the clear
        ("clear", "b", ["commit", "process_b"], (first, last), note, True),
        ("unpause", "b"),
    ]
    assert cleared == [
        "txid-000003: commit",
        "txid-000003: process_a",
        "txid-000003: commit",
        "txid-000003: process_b",
    ]
    assert api.paused == set()


def test_a_dag_paused_before_stays_paused_and_one_unpaused_is_unpaused_when_the_clear_fails():
    api = Api(paused={"kept"})
    restart_runs(api, ["kept"], rewound(3))
    assert ("unpause", "kept") not in api.calls and api.paused == {"kept"}

    failing = Api(fail_clear=True)
    with pytest.raises(ConnectionError):
        restart_runs(failing, ["a"], rewound(3))
    assert failing.calls[-1] == ("unpause", "a") and failing.paused == set()
