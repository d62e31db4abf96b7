"""What the tasks of a txid's DAG run share: which txid the run is, what it claimed, its log.

The operators (:mod:`airflow_txn_provider.operators.txn`) and the failure sensor
(:mod:`airflow_txn_provider.sensors.txn_failure`) both read a run's context the same way. So the
helpers live here, apart from either: the sensor does not import the operators.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.airflow import STARTS_FROM_TRIGGER, AirflowFailException
from airflow_txn_provider.log.advisory import held_count, held_slot
from airflow_txn_provider.log.changes import PipelineChanges
from airflow_txn_provider.rules.coordinator import committable, plan_begin
from airflow_txn_provider.rules.vocabulary import BeginAction
from airflow_txn_provider.rules.waiting import (
    awaits_its_turn,
    blocked_by,
    may_begin_now,
    may_end_ahead_wait,
    may_end_previous_wait,
    may_end_turn_wait,
    previous_unbegun,
    runs_ahead,
)
from airflow_txn_provider.timetables import txid_from_run_id
from airflow_txn_provider.transactions.commit import commit_ready

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

    from airflow_txn_provider.log.advisory import HeldSlot
    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from airflow_txn_provider.triggers.txn_log import TxnLogTrigger

BEGIN_TASK_ID = "begin"
WATCH_TASK_ID = "watch_failures"
COMMIT_TASK_ID = "commit"
CLAIM_XCOM_KEY = "claim"
"""XCom key of what the claiming task claimed: ``{"txid", "attempt", "metadata"}``."""


def run_txid(context: Context, pipeline: str) -> int:
    """The txid of the running DAG run: from its run id ``txid-000042`` (the runs the timetable
    schedules), or from ``{"txid": 42}`` in the conf of a manual run (``dag.test``, debugging)."""
    dag_run = context["dag_run"]
    txid = txid_from_run_id(dag_run.run_id)
    if txid is not None:
        return txid
    conf_txid = (getattr(dag_run, "conf", None) or {}).get("txid")
    if isinstance(conf_txid, int) and not isinstance(conf_txid, bool) and conf_txid >= 1:
        return conf_txid
    raise AirflowFailException(
        f"pipeline={pipeline}: run {dag_run.run_id!r} is not a transaction (run ids are "
        "txid-000042): transactions start by themselves once the DAG is unpaused; to run one txid "
        'by hand (dag.test, debugging) pass the conf {"txid": 42}. A run on a txid\'s logical '
        "date (2000-01-01 plus txid - 1 milliseconds) holds that txid's place: once it ends, the "
        "pipeline deletes it and creates the txid's own run"
    )


def is_scheduled_txid_run(context: Context) -> bool:
    return txid_from_run_id(context["dag_run"].run_id) is not None


def claimed(
    context: Context,
    claim_task_id: str = BEGIN_TASK_ID,
    *,
    txlog: TransactionLog | None = None,
    pipeline: str | None = None,
) -> dict[str, Any]:
    """What the run's claiming task claimed: ``{"txid", "attempt", "metadata"}``.

    A one-job pipeline's processing task publishes its claim only when its run goes on to its
    commit task (:meth:`~airflow_txn_provider.operators.txn.TxnProcessOperator.execute`). Given
    ``txlog`` and ``pipeline``, a claim it did not publish (it was killed, or the api-server was
    away) is the attempt the log holds for the run's txid, which the commit gate then judges."""
    value = context["ti"].xcom_pull(task_ids=claim_task_id, key=CLAIM_XCOM_KEY)
    if not value and txlog is not None and pipeline is not None:
        txid = run_txid(context, pipeline)
        info = txlog.transaction(pipeline, txid)
        if info is not None:
            return {"txid": txid, "attempt": info.attempt, "metadata": info.metadata}
    if not value:
        raise AirflowFailException(f"task {claim_task_id} recorded no claimed attempt for this run")
    return dict(value)


def pipeline_log(txn_pipeline: TxnPipeline) -> TransactionLog:
    """The pipeline's transaction log, as every task of its DAG opens it: the hook shares one
    engine per process and checks the schema once per process."""
    # at call time: at the top it adds the Postgres provider to every parse of a DAG
    # file, which Airflow repeats in every task start and for every callback
    from airflow_txn_provider.hooks.txn_log import TxnLogHook

    return TxnLogHook(txn_log_conn_id=txn_pipeline.txn_log_conn_id).get_log()


def declare_pipeline(txlog: TransactionLog, txn_pipeline: TxnPipeline, dag_id: str) -> bool:
    """Register ``txn_pipeline`` and declare its outputs, as its DAG file says now (one read
    when the log holds this declaration already): what a txid's claim and the fill task do
    first."""
    return txlog.ensure_pipeline(
        txn_pipeline.name,
        source_kind=txn_pipeline.source.kind,
        max_pending=txn_pipeline.max_pending,
        dag_id=dag_id,
        states=txn_pipeline.states,
        keep_txids=txn_pipeline.keep_txids,
        sinks=txn_pipeline.sinks,
        start=txn_pipeline.start,
        retired=txn_pipeline.retired,
        replays_exactly=txn_pipeline.source.replays_exactly,
    )


def pipeline_log_url(txn_pipeline: TxnPipeline) -> str:
    """The URL of the pipeline's log (its connection's, password included: never logged)."""
    # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
    from airflow_txn_provider.hooks.txn_log import TxnLogHook

    return TxnLogHook(txn_log_conn_id=txn_pipeline.txn_log_conn_id).log_url()


def start_in_triggerer(
    task: BaseOperator, trigger: TxnLogTrigger, next_method: str, enabled: bool = True
) -> None:
    """Start ``task`` in the triggerer (``start_from_trigger``), waiting on ``trigger``, whose
    txid and attempt the trigger reads from its run (``RUN_TXID``, ``FIRST_WATCHED``): no worker
    process unless the trigger wakes ``next_method``. Most txids then need one worker-task start
    in all, their processing: a task start costs more CPU than the commit's SQL.
    ``dag.test()`` and a worker that runs such a task anyway call ``execute``, which waits the
    classic way (deferring from the worker), as every task does on Airflow 3.1 and 3.2, whose
    scheduler ignores ``start_from_trigger`` (``compat.airflow.STARTS_FROM_TRIGGER``)."""
    from airflow.triggers.base import StartTriggerArgs

    if not (enabled and STARTS_FROM_TRIGGER):
        return
    path, kwargs = trigger.serialize()
    task.start_from_trigger = True
    task.start_trigger_args = StartTriggerArgs(
        trigger_cls=path, trigger_kwargs=kwargs, next_method=next_method, timeout=None
    )


def last_error(txlog: TransactionLog, pipeline: str, txid: int) -> str:
    """The last error recorded for ``txid``, or ``(none recorded)``: what a task reports."""
    info = txlog.transaction(pipeline, txid)
    return (info.last_error if info else None) or "(none recorded)"


def why_waiting(txlog: TransactionLog, txn_pipeline: TxnPipeline, txid: int) -> str:
    """Which txid this one waits for, and why: what the UI and a person reading the log need."""
    view = txlog.view(txn_pipeline.name)
    blocker = blocked_by(view, txid)
    if blocker is not None:
        error = last_error(txlog, txn_pipeline.name, blocker.txid)
        return f"blocked by txid {blocker.txid} (failed, attempt {blocker.attempt}: {error})"
    if txid > view.next_new_txid:
        return f"txid {txid - 1} has not begun yet"
    return (
        f"window full: txids {view.window.start}..{view.window.stop - 1} in flight "
        f"(max_pending={view.max_pending}"
        f"{', fitted to its Spark' if txn_pipeline.fits_window else ''})"
    )


AHEAD_WAIT = 60.0
"""Seconds the claim of a txid past a full window waits in its worker for its turn to begin,
before it defers (see :func:`~airflow_txn_provider.rules.waiting.runs_ahead`): with a backlog,
that is a few txids' processing away."""
AHEAD_POLL = 0.1
"""Seconds between two looks at the log while it waits, where the log cannot ``LISTEN`` (else
it waits for the log's notification: :mod:`airflow_txn_provider.log.changes`)."""
PREVIOUS_WAIT = 10.0
"""Seconds a run made ahead waits in its worker for the first begin of the txid before it (made
with it: a scheduling round at most), before it defers."""
COMMIT_WAIT = 30.0
"""Seconds a processed txid's task waits at most in its worker for the txids before it to commit
(:func:`commit_in_turn`)."""
COMMIT_POLL = 0.25
"""Seconds between two looks at the log while a processed txid waits for its turn, where the log
cannot ``LISTEN``: the task before it commits it, so a later look only ends the wait later, it
delays no commit."""
COMMIT_WAITS_OPTION = "commit_waits"
DEFAULT_COMMIT_WAITS = 4
_COMMIT_LOCK_CLASS = 0x7478_6E43  # "txnC": the advisory locks of the commit wait slots
AHEAD_WAITS_OPTION = "run_ahead_waits"
DEFAULT_AHEAD_WAITS = 4
_AHEAD_LOCK_CLASS = 0x7478_6E41  # "txnA": the advisory locks of the run ahead's wait slots


def _slot_count(option: str, default: int) -> int:
    """An ``[txn_provider]`` count of wait slots: an int, never negative (0: none waits)."""
    from airflow.configuration import conf

    n = conf.getint("txn_provider", option, fallback=default)
    if n < 0:
        raise ValueError(f"[txn_provider] {option} must be >= 0, got {n}")
    return n


def ahead_waits() -> int:
    """``[txn_provider] run_ahead_waits``: how many run aheads of one log may wait in workers at
    once, all pipelines together (0: none waits, each defers at once)."""
    return _slot_count(AHEAD_WAITS_OPTION, DEFAULT_AHEAD_WAITS)


def ahead_wait_slot(txlog: TransactionLog) -> AbstractContextManager[HeldSlot | None]:
    """One of the log's :func:`ahead_waits` wait slots, held for the block; ``None`` if all are
    taken."""
    return held_slot(txlog.engine, _AHEAD_LOCK_CLASS, range(ahead_waits()))


def ahead_wait_slots_free(txlog: TransactionLog) -> int:
    """How many of the log's wait slots are free now: a claim creates that many runs ahead at
    most (:func:`~airflow_txn_provider.triggers.waker.make_runs_ahead`). 0 when the log cannot
    say: the waker creates the runs once the window has room."""
    try:
        return max(0, ahead_waits() - held_count(txlog.engine, _AHEAD_LOCK_CLASS))
    except Exception:  # an optimisation: without it, the waker's way
        return 0


def commit_waits() -> int:
    """``[txn_provider] commit_waits``: how many processing tasks of one log may wait in their
    workers at once, all pipelines together, for the txids before theirs to commit (0: none)."""
    return _slot_count(COMMIT_WAITS_OPTION, DEFAULT_COMMIT_WAITS)


def commit_in_turn(
    txlog: TransactionLog, txn_pipeline: TxnPipeline, txid: int, logger: Any
) -> tuple[bool, list[int]]:
    """After processed ``txid`` found the txids before it uncommitted: wait in the worker, with
    one of the log's :func:`commit_waits` slots, while they still process (at most
    ``COMMIT_WAIT`` seconds; woken by the log's notifications, :mod:`~airflow_txn_provider.log.
    changes`), committing what is ready at each look. Returns whether ``txid``
    committed (by this task or by the task of a txid before it, which commits the processed
    txids after its own) and the txids this task committed.

    The wait costs a worker slot for about one txid's processing; not waiting costs the run's
    ``commit`` and ``watch_failures`` a trigger each and their ends in the triggerer, which
    Airflow answers with a DAG-file parse in the dag-processor. Without a free slot, or once a
    txid before it fails, the run's commit task commits it."""
    done: list[int] = []
    deadline = time.monotonic() + COMMIT_WAIT
    with held_slot(txlog.engine, _COMMIT_LOCK_CLASS, range(commit_waits())) as slot:
        if slot is None:
            return False, done
        with PipelineChanges(txlog.engine, txn_pipeline.name, fallback=COMMIT_POLL) as changes:
            while time.monotonic() < deadline:
                view = txlog.view(txn_pipeline.name)  # read after listening: no commit goes unseen
                if view.last_committed >= txid:
                    return True, done
                if not awaits_its_turn(view, txid):
                    break
                if committable(view) is not None:
                    done += commit_ready(txlog, txn_pipeline, logger, view=view)
                    continue
                changes.wait(
                    deadline - time.monotonic(),
                    ends_wait=partial(may_end_turn_wait, txid=txid),
                )
    return txid in done, done


def previous_began(txlog: TransactionLog, pipeline: str, txid: int, deadline: float) -> bool:
    """Wait while ``txid - 1`` has never begun (their runs were made together, and their claims
    race: :func:`~airflow_txn_provider.rules.waiting.runs_to_make`), at most ``PREVIOUS_WAIT``
    seconds and until ``deadline``; True once ``txid`` may begin as far as ``txid - 1`` goes.
    ``False`` at once for a run made past the window (:func:`window_moved` is its wait, in a wait
    slot), when ``txid - 1`` began but waits to be initialised again (a replay: the task defers
    and its trigger waits) and at the end of the wait."""
    until = min(deadline, time.monotonic() + PREVIOUS_WAIT)
    with PipelineChanges(txlog.engine, pipeline, fallback=AHEAD_POLL) as changes:
        while time.monotonic() < until:
            view = txlog.view(pipeline)
            if txid in runs_ahead(view):
                return False
            if not previous_unbegun(view, txid):
                return plan_begin(view, txid).action is not BeginAction.WAIT_PREVIOUS
            changes.wait(
                until - time.monotonic(),
                ends_wait=partial(may_end_previous_wait, txid=txid),
            )
    return False


def window_moved(txlog: TransactionLog, pipeline: str, txid: int, deadline: float) -> bool:
    """Wait until ``txid`` may begin (the txid before it began, and the oldest txid committed),
    if its run was made past the window (:func:`~airflow_txn_provider.rules.waiting.runs_ahead`)
    and one of the log's :func:`ahead_waits` wait slots is free; ``False`` at once for any other
    txid (a rewind's later txids: they defer) or with every slot taken, and once ``deadline``
    (``time.monotonic``) passes or the txid is no longer ahead (a txid before it failed).

    The slots bound the worker slots that waits hold: with many pipelines backlogged, runs ahead
    waiting in workers would take the slots of the processing tasks whose commits they wait for.
    The wait itself costs no CPU: it blocks until the log notifies a change of the pipeline
    (:mod:`airflow_txn_provider.log.changes`).
    """
    view = txlog.view(pipeline)
    if txid not in runs_ahead(view):
        return False
    with ahead_wait_slot(txlog) as slot:
        if slot is None:
            return False
        with PipelineChanges(txlog.engine, pipeline, fallback=AHEAD_POLL) as changes:
            while time.monotonic() < deadline:
                view = txlog.view(pipeline)  # read after listening: no change goes unseen
                if may_begin_now(view, txid):
                    return True
                if txid not in runs_ahead(view):
                    return False
                changes.wait(  # the window of this view: a wake-up reads the log again
                    deadline - time.monotonic(),
                    ends_wait=partial(may_end_ahead_wait, txid=txid, max_pending=view.max_pending),
                )
    return False


def fail_attempt_on_task_failure(context: Context) -> None:
    """``on_failure_callback`` of a processing task: Airflow failed the task (it raised, timed
    out, or its process stopped heartbeating), so its attempt will report nothing: fail it now
    rather than when its lease runs out. Best effort: the lease is the guarantee."""
    ti, task = context["ti"], context.get("task")
    if (txn_pipeline := getattr(task, "txn_pipeline", None)) is None:
        return
    if getattr(task, "stopped", False):  # on_kill ran in this process: see its docstring
        msg = "pipeline=%s: task %s (try %s) was stopped: a later try or the lease decides"
        logging.getLogger(__name__).warning(msg, txn_pipeline.name, ti.task_id, ti.try_number)
        return
    try:
        # the claim this process made, else the one its claiming task published
        claim = getattr(task, "_lineage_claim", None) or claimed(
            context, getattr(task, "claim_task_id", BEGIN_TASK_ID)
        )
        error = f"task {ti.task_id} (try {ti.try_number}) failed in Airflow"
        exception = context.get("exception")
        if exception is not None:
            error += f": {type(exception).__name__}: {str(exception)[:500]}"
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        TxnLogHook(txn_log_conn_id=txn_pipeline.txn_log_conn_id).get_log(migrate=False).fail(
            txn_pipeline.name, claim["txid"], claim["attempt"], error=error, of_processing=True
        )
    except Exception:  # never mask the task's own failure; the lease catches what this misses
        logging.getLogger(__name__).exception(
            "pipeline=%s: could not fail the attempt of task %s", txn_pipeline.name, ti.task_id
        )
