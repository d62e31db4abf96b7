"""The waker: a pipeline's always-on watch, which makes a txid's DAG run once there is work.

Airflow runs it as the ``AssetWatcher`` of the pipeline DAG's schedule, while the DAG is unpaused.
It fires no event (an asset-triggered run has no logical date): it creates ``txid-00000N`` with
the txid's logical date through the REST API, idempotently (409 if it exists). Every
``poll_interval`` it asks :func:`~airflow_txn_provider.rules.waiting.new_txid_due` and whether the
source has data for that txid (the log only every ``QUIET_LOG_EVERY`` seconds with none in
flight), so an idle pipeline holds no run. A claim makes the runs after its own
(:func:`make_runs_ahead`); the waker asks for one only if its txid has not begun
``RECREATE_AFTER`` seconds later. It is also the liveness watch: a txid that waits too long for a
task (:mod:`airflow_txn_provider.rules.liveness`) gets it restarted or its run made again
(:mod:`~airflow_txn_provider.triggers.run_keeper`), and what cannot be mended is recorded as the
pipeline's *run trouble*. docs/airflow.md, "Who creates the runs: the waker", has the rest.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_txn_provider.compat.airflow import (
    SUPERVISOR_COMMS_THREAD_SAFE,
    TASKS_CREATE_RUNS,
    run_blocking,
)
from airflow_txn_provider.hooks.airflow_api import AirflowApiHook, create_txid_run_from_task
from airflow_txn_provider.rules.config import RUNS_AHEAD
from airflow_txn_provider.rules.exceptions import TxnError, UnknownPipelineError
from airflow_txn_provider.rules.liveness import Need, Overdue
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.waiting import new_txid_due, runs_to_make
from airflow_txn_provider.run_context import COMMIT_TASK_ID, WATCH_TASK_ID, ahead_wait_slots_free
from airflow_txn_provider.sources.base import source_from_spec
from airflow_txn_provider.sources.catalog import with_log_catalog
from airflow_txn_provider.triggers.run_keeper import ensure_txid_run, keep_alive
from airflow_txn_provider.triggers.txn_log import shared_engine, shared_view
from airflow_txn_provider.utils.retries import Backoff

if TYPE_CHECKING:
    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

QUIET_LOG_EVERY = 10.0
"""Seconds between looks at the log while nothing is in flight (the source is looked at every
``poll_interval``; a look that finds data reads the log again before creating a run)."""
RECREATE_AFTER = 60.0
"""Seconds before the waker asks again for a run it created whose txid has not begun since
(a run that already exists answers 409: harmless)."""
_UNKNOWN = "(not read)"
RETRY_HELD_AFTER = 5.0
"""Seconds before the waker asks again for a run whose slot another run holds."""
REPORT_EVERY = 60.0
"""Seconds between two log lines about the same kind of trouble (the log, the source, the API)."""


def _migrate(hook: Any) -> None:
    """The log's schema at head, as a claim's begin brings it (``get_log`` migrates)."""
    hook.get_log(migrate=True).engine.dispose()


def _report_trouble(hook: Any, pipeline: str, trouble: str | None) -> None:
    """Record (``None``: clear) the pipeline's run trouble in the log, for its health."""
    hook.get_log(migrate=False).report_run_trouble(pipeline, trouble)


def source_has_data(source: Any, txid: int, prev_metadata: Any) -> bool:
    """Whether ``source`` has a batch for ``txid`` after ``prev_metadata``, as a begin would
    decide it, without recording anything. Blocking: the waker calls it in a thread."""
    source.prefetch()
    return source.initialize_transaction(txid, prev_metadata) is not None


def make_runs_ahead(
    view: PipelineView,
    source: Any,
    create: Callable[[int], bool],
    *,
    wait_slots_free: Callable[[], int] = lambda: RUNS_AHEAD,
) -> list[int]:
    """Right after a claim began its txid (``view`` read since): make the runs
    :func:`~airflow_txn_provider.rules.waiting.runs_to_make` names, oldest first, while the
    source has data for each (as each begin would decide it, from the batch before it), those
    past the window only as many as ``wait_slots_free()`` (the log's free wait slots: asked once,
    when the first is reached). The waker's question, asked by the claim at once and for the
    whole window, so that a backlog fills the window, and keeps it full, without a poll and a
    scheduling round per txid.

    Returns the txids whose runs it made. It stops at a run that exists (``create`` answers
    False): another claim made it, or another run holds its txid's logical date (a person's
    trigger), which the waker, not noting it made, looks into. A refused request raises."""
    wanted = runs_to_make(view)
    if not wanted:
        return []
    source.prefetch()
    metadata = view.metadata_before(view.next_new_txid)
    made: list[int] = []
    slots: int | None = None  # wait slots for the runs past the window, once asked
    for txid in range(view.next_new_txid, wanted.stop):
        metadata = source.initialize_transaction(txid, metadata)
        if metadata is None:
            break
        if txid not in wanted:
            continue
        if txid >= view.window.stop:
            slots = wait_slots_free() if slots is None else slots
            if slots <= 0:
                break
            slots -= 1
        if not create(txid):
            break  # made already, or its slot held by another run: the waker looks which
        made.append(txid)
    return made


def start_making_runs(
    txn_pipeline: TxnPipeline,
    dag_id: str,
    txid: int,
    txlog: TransactionLog,
    logger: Any,
) -> threading.Thread | None:
    """:func:`make_runs_ahead` in a thread, beside ``txid``'s own work (its claim calls it), and
    the newest txid made noted in the log for the next claim and the waker: best effort, the
    waker's next poll makes a due run all the same. Returns the thread, for the task to join
    (none below Airflow 3.3, where it runs first, in the caller's thread:
    ``compat.airflow.SUPERVISOR_COMMS_THREAD_SAFE``)."""

    def make() -> None:
        made: list[int] = []
        try:
            if TASKS_CREATE_RUNS:  # by the task's supervisor, with its client and token
                create: Callable[[int], bool] = functools.partial(create_txid_run_from_task, dag_id)
            else:
                api = AirflowApiHook(txn_pipeline.airflow_api_conn_id, outage_timeout=10.0)
                create = functools.partial(api.create_txid_run, dag_id)
            source = with_log_catalog(txn_pipeline.source, txlog.engine)
            made = make_runs_ahead(
                txlog.view(txn_pipeline.name),
                source,
                create,
                wait_slots_free=lambda: ahead_wait_slots_free(txlog),
            )
        except Exception as err:
            msg = "pipeline=%s txid=%s: later txids' runs are left to the waker (%s: %s)"
            logger.warning(msg, txn_pipeline.name, txid, type(err).__name__, str(err)[:300])
        if not made:
            return
        msg = "pipeline=%s txid=%s: more data waits: the runs of txids %s-%s are made"
        logger.info(msg, txn_pipeline.name, txid, made[0], made[-1])
        try:
            txlog.note_runs_made(txn_pipeline.name, made[-1])
        except Exception as err:  # a hint: without it the waker asks Airflow itself
            msg = "pipeline=%s: could not note the runs made (%s: %s)"
            logger.warning(msg, txn_pipeline.name, type(err).__name__, str(err)[:300])

    if not SUPERVISOR_COMMS_THREAD_SAFE:
        # below Airflow 3.3 the look-ups (the REST API's connection, a source's, the secrets
        # they hold) would ask the supervisor beside the task's own requests: both hang
        make()
        return None
    thread = threading.Thread(target=make, name=f"txn-runs-ahead-{txid}", daemon=True)
    thread.start()
    return thread


class TxnWakerTrigger(BaseEventTrigger):
    """Create the DAG run of a pipeline's next txid once the window has room and its source has
    data for it (see the module's doc). Never fires.

    :param txn_log_conn_id: the ``txn_log`` connection.
    :param airflow_api_conn_id: the connection to Airflow's REST API (creates the runs).
    :param pipeline: the pipeline's name in the log.
    :param dag_id: the DAG whose runs it creates.
    :param source: the pipeline's source, as :meth:`~airflow_txn_provider.sources.base.
        SparkSource.to_spec` gives it.
    :param poll_interval: seconds between looks (the pipeline's ``poll_interval``).
    """

    def __init__(
        self,
        *,
        txn_log_conn_id: str,
        airflow_api_conn_id: str,
        pipeline: str,
        dag_id: str,
        source: dict[str, Any],
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__()
        if not float(poll_interval) > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.txn_log_conn_id = txn_log_conn_id
        self.airflow_api_conn_id = airflow_api_conn_id
        self.pipeline = pipeline
        self.dag_id = dag_id
        self.source = dict(source)
        self.poll_interval = float(poll_interval)
        self._reported: dict[str, float] = {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "txn_log_conn_id": self.txn_log_conn_id,
                "airflow_api_conn_id": self.airflow_api_conn_id,
                "pipeline": self.pipeline,
                "dag_id": self.dag_id,
                "source": self.source,
                "poll_interval": self.poll_interval,
            },
        )

    def _report(self, kind: str, message: str, *args: Any) -> None:
        """A warning, at most once per ``REPORT_EVERY`` seconds for each ``kind``."""
        now = time.monotonic()
        if now - self._reported.get(kind, -REPORT_EVERY) >= REPORT_EVERY:
            self._reported[kind] = now
            self.log.warning("pipeline=%s: " + message, self.pipeline, *args)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.wake_forever()
        return
        yield  # an async generator, as Airflow asks of a trigger; it never fires (see the doc)

    async def wake_forever(self) -> None:
        """The waker's loop on the real log, source and REST API (:meth:`wake`)."""
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        read_view = await self.log_reader()
        api = AirflowApiHook(self.airflow_api_conn_id, outage_timeout=30.0)
        hook = TxnLogHook(txn_log_conn_id=self.txn_log_conn_id)
        source = with_log_catalog(
            await run_blocking(source_from_spec, self.source), await run_blocking(hook.get_engine)
        )
        pipeline = self.pipeline

        async def has_data(txid: int, prev: Any) -> bool:
            return await run_blocking(source_has_data, source, txid, prev)

        async def create_run(txid: int) -> tuple[bool, str]:
            return await run_blocking(ensure_txid_run, api, self.dag_id, txid)

        async def keep(rec: TxRecord, need: Need) -> str | None:
            restart = functools.partial(
                keep_alive, watch_task=WATCH_TASK_ID, commit_task=COMMIT_TASK_ID
            )
            return await run_blocking(restart, api, self.dag_id, rec, need)

        async def report_trouble(trouble: str | None) -> None:
            await run_blocking(_report_trouble, hook, pipeline, trouble)

        self.log.info("pipeline=%s: waker of DAG %s started", pipeline, self.dag_id)
        await self.wake(
            read_view, has_data, create_run, asyncio.sleep, keep=keep, report_trouble=report_trouble
        )

    async def log_reader(self) -> Callable[[], Awaitable[PipelineView | None]]:
        """What :meth:`wake` reads the log with: the pipeline's shared view (``None`` until the
        pipeline is declared: its first claim declares it, so txid 1 is due). Its first call
        brings the log's schema to head, as a claim's begin does: on a new deployment the log
        has no tables yet, and the first claim's run is the waker's to create."""
        # at call time: at the top it adds to a DAG file's parse (the Postgres provider)
        from airflow_txn_provider.hooks.txn_log import TxnLogHook

        hook = TxnLogHook(txn_log_conn_id=self.txn_log_conn_id)
        engine = shared_engine(await hook.async_sqlalchemy_url())
        migrated = False

        async def read_view() -> PipelineView | None:
            nonlocal migrated
            if not migrated:
                await run_blocking(_migrate, hook)
                migrated = True
            try:
                return await shared_view(engine, self.pipeline, max_age=self.poll_interval)
            except UnknownPipelineError:
                return None

        return read_view

    async def wake(
        self,
        read_view: Callable[[], Awaitable[PipelineView | None]],
        has_data: Callable[[int, Any], Awaitable[bool]],
        create_run: Callable[[int], Awaitable[tuple[bool, str]]],
        sleep: Callable[[float], Awaitable[Any]],
        *,
        keep: Callable[[TxRecord, Need], Awaitable[str | None]] | None = None,
        report_trouble: Callable[[str | None], Awaitable[None]] | None = None,
    ) -> None:
        """Poll until cancelled: ``read_view`` (``None``: the pipeline is not in the log yet),
        ``has_data(txid, prev_metadata)``, ``create_run(txid)`` (whether the txid's run is
        there now, and what was found or done: :func:`~airflow_txn_provider.triggers.
        run_keeper.ensure_txid_run`) and ``sleep`` are the log, the source, the REST API and the
        clock; ``keep(rec, need)`` restarts what a waiting txid's run lacks (:func:`~airflow_txn_
        provider.triggers.run_keeper.keep_alive`), ``report_trouble`` records (or, with ``None``,
        clears) why a due txid's run could not be created."""
        pipeline = self.pipeline
        view: PipelineView | None = None
        read_at = -float("inf")
        created: dict[int, float] = {}
        failures = 0
        trouble = Backoff(first=self.poll_interval, cap=30.0, deadline=float("inf"), floor=0.5)
        overdue = Overdue()
        reported: str | None = _UNKNOWN  # what the log holds: cleared at the first poll
        refused = False  # whether ``reported`` is the source's refusal
        while True:
            now = time.monotonic()
            try:
                busy = view is not None and bool(view.in_flight)
                if busy or now - read_at >= QUIET_LOG_EVERY:
                    view, read_at = await read_view(), now
                if keep is not None and view is not None:
                    for rec, need in overdue.update(view, now):
                        await self._keep(keep, rec, need)
                due = new_txid_due(view)
                if due is not None and view is not None and due <= view.runs_made_through:
                    # a claim made its run ahead: asked for only if it has not begun a while later
                    if due not in created:
                        created = {t: at for t, at in created.items() if t >= due}
                        created[due] = now
                # unchanged until the run is asked for again
                problem = reported if due is not None and reported != _UNKNOWN else None
                if due is not None and now - created.get(due, -RECREATE_AFTER) >= RECREATE_AFTER:
                    prev = None if view is None else view.metadata_before(due)
                    has, refusal = await self._has_data(has_data, due, prev)
                    if refusal is None and refused:
                        problem = None  # the source answers again: its refusal is over
                    refused = refusal is not None
                    if has:
                        # Data appeared: ask the log again (the view may be QUIET_LOG_EVERY old)
                        view, read_at = await read_view(), time.monotonic()
                        if new_txid_due(view) == due:
                            settled, said = await create_run(due)
                            created = {t: at for t, at in created.items() if t >= due}
                            created[due] = time.monotonic() - (
                                0.0 if settled else RECREATE_AFTER - RETRY_HELD_AFTER
                            )
                            self.log.info("pipeline=%s txid=%s: %s", pipeline, due, said)
                            problem = None if settled else said
                    if refusal is not None:
                        problem = refusal
                if report_trouble is not None and problem != reported:
                    await report_trouble(problem)
                    reported = problem
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a watcher that raised would not be run again: never raise
                failures += 1
                pause = trouble.wait(failures)
                self._report(
                    type(err).__name__,
                    "the waker could not look or create a run (%s: %s); trying again in %.1f s",
                    type(err).__name__,
                    (str(err).strip().splitlines() or [""])[0][:300],
                    pause,
                )
                await sleep(pause)
                continue
            await sleep(self.poll_interval)

    async def _keep(
        self,
        keep: Callable[[TxRecord, Need], Awaitable[str | None]],
        rec: TxRecord,
        need: Need,
    ) -> None:
        """Restart what the run of waiting ``rec`` lacks; trouble is reported, not raised (the
        next look, ``RECHECK_EVERY`` later, tries again), so it never keeps new runs waiting."""
        try:
            done = await keep(rec, need)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._report(
                f"keep {rec.txid}",
                "txid=%s: could not look at its run (%s: %s); looking again later",
                rec.txid,
                type(err).__name__,
                str(err)[:300],
            )
            return
        if done is not None:
            self.log.warning("pipeline=%s txid=%s: %s", self.pipeline, rec.txid, done)

    async def _has_data(
        self, has_data: Callable[[int, Any], Awaitable[bool]], txid: int, prev: Any
    ) -> tuple[bool, str | None]:
        """Whether the source has data for ``txid``, and why it could not say if it could not.
        A source that raises (a lost Kafka log, a broker down, a missing folder) counts as
        having data: the run's claim then asks again and fails with the typed error on the run;
        the why becomes the pipeline's run trouble, so its health and the Transactions page say
        it too (stalled after :data:`~airflow_txn_provider.log.health.STUCK_AFTER`) until a
        look succeeds."""
        try:
            return await has_data(txid, prev), None
        except Exception as err:
            if isinstance(err, TxnError) and err.pipeline is None:
                err = err.naming(self.pipeline, txid)
            first_line = (str(err).strip().splitlines() or [""])[0][:300]
            self._report(
                "source",
                "txid=%s: the source could not say whether it has data (%s: %s): creating the "
                "run, whose claim reports it",
                txid,
                type(err).__name__,
                first_line,
            )
            return True, f"txid {txid}: the source cannot say: {type(err).__name__}: {first_line}"
