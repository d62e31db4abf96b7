"""One trigger that waits, without a worker slot, until the transaction log reaches a condition.

Triggers may run more than once, so it only *reads* the log (the operators make every
transition); each poll loads the pipeline's view (async psycopg 3) and asks the pure rules
whether to wake. As it outlives the processes it watches, the failure sensor's trigger notices an
attempt whose lease ran out. It rides out a restarting database for ``outage_timeout`` seconds
(:func:`outage_backoff`) instead of failing its task. A triggerer's triggers poll through one
pool per log (:func:`shared_engine`, ``[txn_provider] trigger_pool_size``), and a pipeline's
triggers share one look at its log per ``poll_interval`` (:func:`shared_view`).
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TaskSkippedEvent, TaskSuccessEvent, TriggerEvent

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.log.alerts import ALERT_CHECK_EVERY, due_alerts
from airflow_txn_provider.log.reads import SNAPSHOT
from airflow_txn_provider.log.rows import load_view
from airflow_txn_provider.rules.exceptions import UnknownPipelineError
from airflow_txn_provider.rules.fencing import lease_expired
from airflow_txn_provider.rules.records import PipelineView
from airflow_txn_provider.rules.vocabulary import EventState, TxStatus
from airflow_txn_provider.rules.waiting import (
    GateState,
    TxnEvent,
    awaits_commit,
    awaits_requeue,
    commit_gate,
    first_watched_attempt,
    may_begin_now,
    txid_outcome,
)
from airflow_txn_provider.timetables import txid_from_run_id
from airflow_txn_provider.utils.retries import DEFAULT_OUTAGE_TIMEOUT, Backoff, is_transient

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

DEFAULT_TRIGGER_POOL_SIZE = 4
RUN_TXID = 0
"""``txid`` of a trigger that starts its task (``start_from_trigger``: its kwargs are fixed when
the DAG is parsed): the txid of the run its task instance belongs to."""
FIRST_WATCHED = -1
"""``attempt`` of an ``OUTCOME`` trigger that starts its task: the attempt the run's claim holds,
read at the first poll (:func:`~airflow_txn_provider.rules.waiting.first_watched_attempt`)."""
READY_POLLS = 2
"""A ``COMMITTED`` trigger wakes its task to commit a txid only once the txid was ready to commit
(processed, ``txid - 1`` committed) on this many polls in a row: the task that recorded its output
commits it a few milliseconds later, and waking a worker for that would be a wasted task start."""

_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncEngine]] = (
    weakref.WeakKeyDictionary()
)
"""The triggerer runs every trigger in one event loop; an async engine belongs to the loop that
opened its connections, so pools are kept per loop (and go with it)."""


def outage_backoff(poll_interval: float, outage_timeout: float) -> Backoff:
    """The waits between polls of a log that cannot be reached: ``poll_interval`` doubled per
    failure, four times at most and to 10 s at most, each 50-100 % of that; for
    ``outage_timeout`` seconds from the first failure."""
    return Backoff(
        first=2 * poll_interval,
        cap=min(10.0, 16 * poll_interval),
        deadline=outage_timeout,
        floor=0.5,
    )


def trigger_pool_size() -> int:
    from airflow.configuration import conf

    size = conf.getint("txn_provider", "trigger_pool_size", fallback=DEFAULT_TRIGGER_POOL_SIZE)
    if size < 1:
        raise ValueError(f"[txn_provider] trigger_pool_size must be >= 1, got {size}")
    return size


def shared_engine(url: Any) -> AsyncEngine:
    """The engine (and pool) of ``url`` that every trigger of this event loop polls through:
    ``trigger_pool_size`` connections at most, a poll waiting for a free one rather than
    opening another. One snapshot per poll (see TransactionLog.view): triggers only read."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engines = _SHARED.setdefault(asyncio.get_running_loop(), {})
    key = url if isinstance(url, str) else url.render_as_string(hide_password=False)
    engine = engines.get(key)
    if engine is None:
        engine = engines[key] = create_async_engine(
            url,
            pool_size=trigger_pool_size(),
            max_overflow=0,
            pool_timeout=300,  # a busy pool delays a poll; it does not fail the wait
            isolation_level=SNAPSHOT,
            pool_pre_ping=True,
        )
    return engine


@dataclass
class _SharedView:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    view: PipelineView | None = None
    read_at: float = -float("inf")


_VIEWS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, str], _SharedView]] = (
    weakref.WeakKeyDictionary()
)


async def shared_view(engine: AsyncEngine, pipeline: str, *, max_age: float) -> PipelineView:
    """``pipeline``'s view, read through ``engine`` unless a trigger of this event loop read one
    less than ``max_age`` seconds ago: the triggers of a pipeline then share one look at the log
    per interval. Triggers only read, and each decides from the view alone, so a view a few
    hundred milliseconds old only delays a wake-up by as much. A failed read is not kept: each
    waiting trigger retries it with its own backoff."""
    views = _VIEWS.setdefault(asyncio.get_running_loop(), {})
    shared = views.setdefault((id(engine), pipeline), _SharedView())
    async with shared.lock:  # one read at a time; the others then find it fresh
        if shared.view is None or time.monotonic() - shared.read_at >= max_age:
            async with engine.connect() as conn:
                shared.view = await conn.run_sync(lambda c: load_view(c, pipeline))
            shared.read_at = time.monotonic()
        return shared.view


class WaitFor(StrEnum):
    CAN_BEGIN = "can_begin"
    """``txid`` may begin: ``txid - 1`` is (re-)initialised and the window has room."""
    COMMIT_GATE = "commit_gate"
    """``txid - 1`` committed (or the attempt went stale, or the txid committed)."""
    COMMITTED = "committed"
    """The txid committed; or its commit needs a worker: its current attempt failed (the commit
    task fails, the run restarts), or it stays ready to commit for ``READY_POLLS`` polls."""
    OUTCOME = "outcome"
    """The txid committed, an attempt newer than ``attempt`` failed, or the current attempt's lease
    ran out (its process is gone); with a ``requeue_timeout``, also: failed ``attempt`` could
    replay but has waited that long for its run to be restarted (nobody re-queued it)."""


def evaluate(
    wait_for: WaitFor,
    view: PipelineView,
    txid: int,
    attempt: int,
    *,
    stuck_for: float = 0.0,
    requeue_timeout: float | None = None,
    ready_polls: int = 0,
) -> TxnEvent | None:
    """The event to fire now, or ``None`` to keep waiting (pure: unit-tested with plain views);
    its txid is the trigger's to add.

    :param stuck_for: seconds for which :func:`awaits_requeue` has held without a break.
    :param ready_polls: polls in a row (this one included) on which :func:`awaits_commit` held.
    """
    if wait_for is WaitFor.CAN_BEGIN:
        return TxnEvent(EventState.CAN_BEGIN) if may_begin_now(view, txid) else None
    if wait_for is WaitFor.COMMIT_GATE:
        gate = commit_gate(view, txid, attempt)
        return None if gate is GateState.WAIT else TxnEvent(EventState(gate.value))
    outcome = txid_outcome(view, txid)
    if outcome is TxStatus.COMMITTED:
        return TxnEvent(EventState.COMMITTED)
    rec = view.record(txid)
    if rec is None:
        return None
    if wait_for is WaitFor.COMMITTED:
        if outcome is TxStatus.FAILED:
            return TxnEvent(EventState.STALE, rec.attempt)
        if ready_polls >= READY_POLLS:
            return TxnEvent(EventState.OPEN, rec.attempt)
        return None
    if outcome is TxStatus.FAILED:
        if rec.attempt > attempt:
            return TxnEvent(EventState.FAILED, rec.attempt)
        if (
            requeue_timeout is not None
            and stuck_for >= requeue_timeout
            and awaits_requeue(view, txid, attempt)
        ):
            return TxnEvent(EventState.NOT_REQUEUED, rec.attempt)
    elif lease_expired(rec, view.now):
        return TxnEvent(EventState.LEASE_EXPIRED, rec.attempt)
    return None


class TxnLogTrigger(BaseTrigger):
    """Poll the log every ``poll_interval`` seconds until :func:`evaluate` returns an event; it
    fires that event's payload (:meth:`~airflow_txn_provider.rules.waiting.TxnEvent.to_payload`).

    :param txn_log_conn_id: the ``txn_log`` connection.
    :param pipeline: pipeline name.
    :param txid: the txid the waiting task belongs to (``RUN_TXID``: its run's; a run that is no
        txid's fires ``{"state": "manual_run"}`` at once).
    :param attempt: the attempt it holds (``COMMIT_GATE``) or last handled (``OUTCOME``;
        ``FIRST_WATCHED``: the one its run's claim holds).
    :param wait_for: a :class:`WaitFor` value.
    :param end_skipped: with ``end_task_on_commit``, end it as skipped, not successful: a watch
        that had nothing to answer (Airflow parses the task's DAG file in the dag-processor for
        every task that succeeds in the triggerer, to run callbacks it may have; a skipped one
        costs nothing there).
    :param end_task_on_commit: on "committed", end the waiting task successfully here in the
        triggerer (no worker slot, no task start): for a task with nothing left to do then.
    :param requeue_timeout: ``OUTCOME`` only: also wake if the txid is still failed at ``attempt``
        this many seconds after the watch began (``None``: never).
    :param stall_alert_after: ``OUTCOME`` only, the pipeline's alerts on: also wake (``alert``)
        when the txid is the oldest uncommitted one and an alert is due and unsent: a poison
        batch's, or a stall's once the pipeline has not moved for this many seconds
        (:mod:`airflow_txn_provider.log.alerts`; ``None``: no alerts).
    :param outage_timeout: seconds the trigger keeps polling a log it cannot reach before it
        fails (the task's retries then take over).
    """

    def __init__(
        self,
        *,
        txn_log_conn_id: str,
        pipeline: str,
        txid: int,
        wait_for: WaitFor | str,
        attempt: int = 0,
        poll_interval: float = 1.0,
        end_task_on_commit: bool = False,
        requeue_timeout: float | None = None,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT,
        stall_alert_after: float | None = None,
        end_skipped: bool = False,
    ) -> None:
        super().__init__()
        self.end_skipped = bool(end_skipped)
        self.stall_alert_after = None if stall_alert_after is None else float(stall_alert_after)
        if not float(poll_interval) > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.requeue_timeout = None if requeue_timeout is None else float(requeue_timeout)
        self.outage_timeout = float(outage_timeout)
        self.end_task_on_commit = bool(end_task_on_commit)
        self.txn_log_conn_id = txn_log_conn_id
        self.pipeline = pipeline
        self.txid = int(txid)
        self.attempt = int(attempt)
        self.wait_for = WaitFor(wait_for)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "txn_log_conn_id": self.txn_log_conn_id,
                "pipeline": self.pipeline,
                "txid": self.txid,
                "attempt": self.attempt,
                "wait_for": self.wait_for.value,
                "poll_interval": self.poll_interval,
                "end_task_on_commit": self.end_task_on_commit,
                "requeue_timeout": self.requeue_timeout,
                "outage_timeout": self.outage_timeout,
                "stall_alert_after": self.stall_alert_after,
                "end_skipped": self.end_skipped,
            },
        )

    def _may_alert(self, view: PipelineView, txid: int, checked: float) -> bool:
        """Whether to look for due alerts on this poll: only the watch of the oldest uncommitted
        txid does (one per pipeline), every ``ALERT_CHECK_EVERY`` seconds."""
        return (
            self.wait_for is WaitFor.OUTCOME
            and self.stall_alert_after is not None
            and txid == view.last_committed + 1
            and time.monotonic() - checked >= ALERT_CHECK_EVERY
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        txid = self.txid or txid_from_run_id(getattr(self.task_instance, "run_id", "") or "")
        if txid is None:  # started from the triggerer in a manual run: its task knows the txid
            yield TriggerEvent(TxnEvent(EventState.MANUAL_RUN).to_payload())
            return
        attempt = self.attempt
        url = await TxnLogHook(txn_log_conn_id=self.txn_log_conn_id).async_sqlalchemy_url()
        engine = shared_engine(url)
        pipeline = self.pipeline
        ready_polls = 0  # polls in a row on which the txid was ready to commit (COMMITTED)
        stuck_since: float | None = None  # since when the txid awaits a re-queue (OUTCOME)
        outage: float | None = None  # when the log became unreachable
        failures = 0
        backoff = outage_backoff(self.poll_interval, self.outage_timeout)
        alerts_checked = 0.0  # when due alerts were last looked for (OUTCOME)
        stall_after = self.stall_alert_after or 0.0
        while True:
            try:
                view = await shared_view(engine, pipeline, max_age=self.poll_interval)
                due: list[Any] = []
                if self._may_alert(view, txid, alerts_checked):
                    alerts_checked = time.monotonic()
                    look = functools.partial(due_alerts, view=view, stall_after=stall_after)
                    async with engine.connect() as conn:
                        due = await conn.run_sync(look)
            except UnknownPipelineError:
                # A trigger that starts its task may poll before the pipeline's first claim
                # registers it: nothing has begun yet, which is a reason to wait.
                await asyncio.sleep(self.poll_interval)
                continue
            except Exception as err:
                if not is_transient(err):
                    raise
                outage = outage or time.monotonic()
                down = time.monotonic() - outage
                if backoff.out_of_time(down):
                    raise
                failures += 1
                pause = backoff.wait(failures)
                self.log.warning(
                    "pipeline=%s txid=%s: the transaction log is unreachable for %.0f s of "
                    "at most %.0f (%s); polling again in %.1f s",
                    pipeline,
                    txid,
                    down,
                    self.outage_timeout,
                    str(err).strip().splitlines()[0][:200],
                    pause,
                )
                await asyncio.sleep(pause)
                continue
            if outage is not None:
                self.log.info("pipeline=%s: the transaction log is back", pipeline)
                outage, failures = None, 0
            if attempt == FIRST_WATCHED:
                attempt = first_watched_attempt(view, txid)
            now = time.monotonic()
            if self.requeue_timeout is not None and awaits_requeue(view, txid, attempt):
                stuck_since = stuck_since or now
            else:
                stuck_since = None
            if self.wait_for is WaitFor.COMMITTED:
                ready_polls = ready_polls + 1 if awaits_commit(view, txid) else 0
            event = evaluate(
                self.wait_for,
                view,
                txid,
                attempt,
                stuck_for=0.0 if stuck_since is None else now - stuck_since,
                requeue_timeout=self.requeue_timeout,
                ready_polls=ready_polls,
            )
            if event is None and due:
                self.log.warning("pipeline=%s: alerts due %s", pipeline, [a.key for a in due])
                event = TxnEvent(EventState.ALERT, attempt)
            if event is not None:
                self.log.info("pipeline=%s txid=%s: %s", pipeline, txid, event.to_payload())
                if self.end_task_on_commit and event.state is EventState.COMMITTED:
                    yield TaskSkippedEvent() if self.end_skipped else TaskSuccessEvent()
                else:
                    yield TriggerEvent(replace(event, txid=txid).to_payload())
                return
            await asyncio.sleep(self.poll_interval)
