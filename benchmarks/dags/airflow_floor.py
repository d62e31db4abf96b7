"""What Airflow itself spends per DAG run when the run does no work: the floor under any
pipeline that keeps one run per txid in the grid (``make bench-peer`` prints it beside the
pipelines' figures). Shapes, paused until the benchmark unpauses them:

* ``floor_one_task``: one no-op task per run, started on a worker (the least a run can be);
* ``floor_txn_shape``: this provider's shape with no work, as a txid that its processing task
  commits runs it: a no-op worker task that skips the other two (``process_<job>``), the task
  after it (``commit``: never started), and one beside them from the run's start that waits in
  the triggerer until skipped (``watch_failures``);
* ``floor_txn_shape_in_triggerer``: the shape when the commit task has work
  (lake sinks, OpenLineage, or the txid before still processing): the worker task, then a task
  that starts and ends in the triggerer, and another one beside them that does too;
* ``floor_txn_shape_paced``: ``floor_txn_shape`` at the pace a Spark sets: its worker task holds
  one of the Spark's slots (a file lock per core, ``BENCH_FLOOR_PACE_DIR``) for as long as that
  Spark takes per batch (the seconds the benchmark writes to ``seconds`` there), then skips the
  other two; as many runs at once as the window fitted to that Spark and one more waiting for a
  slot, as a run made ahead (``BENCH_FLOOR_PACED_RUNS``): the least that keeps it busy. What
  Airflow itself costs per run when a run lasts as long as a txid's Spark work makes it last,
  with no work of its own.
"""

from __future__ import annotations

import fcntl
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, BaseOperator, task
from airflow.triggers.base import StartTriggerArgs

from airflow_txn_provider.compat.airflow import DownstreamTasksSkipped
from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.timetables import TXID_EPOCH, TxidTimetable

PAST = datetime(2000, 1, 1, tzinfo=UTC)
NEVER = datetime(2999, 1, 1, tzinfo=UTC)


class InTriggerer(BaseOperator):
    """Starts in the triggerer on a trigger that fires at once and ends the task there (as
    ``commit`` and ``watch_failures`` do when their txid commits); ``until_skipped``: one that
    never fires (the task waits there until another task skips it)."""

    def __init__(self, *, until_skipped: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_from_trigger = True
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls="airflow.providers.standard.triggers.temporal.DateTimeTrigger",
            trigger_kwargs={"moment": NEVER if until_skipped else PAST, "end_from_trigger": True},
            next_method="execute_complete",
        )

    def execute(self, context: Any) -> None:  # only if a worker runs it anyway
        return None

    def execute_complete(self, context: Any, event: Any = None) -> None:
        return None


def _dag(dag_id: str, max_active_runs: int = 4) -> DAG:
    return DAG(
        dag_id,
        schedule=TxidTimetable(),
        start_date=TXID_EPOCH,
        catchup=True,
        max_active_runs=max_active_runs,
        is_paused_upon_creation=True,
    )


@task
def noop() -> None:
    return None


with _dag("floor_one_task") as floor_one_task:
    noop()


@task
def commits_its_txid() -> None:
    raise DownstreamTasksSkipped(tasks=["commit", "watch_failures"])


with _dag("floor_txn_shape") as floor_txn_shape:
    commits_its_txid() >> InTriggerer(task_id="commit")
    InTriggerer(task_id="watch_failures", until_skipped=True)

with _dag("floor_txn_shape_in_triggerer") as floor_txn_shape_in_triggerer:
    noop() >> InTriggerer(task_id="commit")
    InTriggerer(task_id="watch_failures")


@task
def holds_spark_then_commits() -> None:
    """Take a free slot of the Spark (a file lock; with none free, wait blocked on one: no CPU),
    hold it for the Spark's seconds per batch, then end the run as a txid its processing task
    commits does."""
    pace = Path(os.environ["BENCH_FLOOR_PACE_DIR"])
    seconds = float((pace / "seconds").read_text())
    slots = [open(slot, "a") for slot in sorted(pace.glob("slot-*"))]
    held = None
    for slot in slots:
        try:
            fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = slot
            break
        except BlockingIOError:
            continue
    if held is None:
        held = slots[os.getpid() % len(slots)]
        fcntl.flock(held, fcntl.LOCK_EX)
    time.sleep(seconds)
    fcntl.flock(held, fcntl.LOCK_UN)
    raise DownstreamTasksSkipped(tasks=["commit", "watch_failures"])


with _dag(
    "floor_txn_shape_paced", int(os.environ.get("BENCH_FLOOR_PACED_RUNS", "2"))
) as floor_txn_shape_paced:
    holds_spark_then_commits() >> InTriggerer(task_id="commit")
    InTriggerer(task_id="watch_failures", until_skipped=True)
