"""Filling outputs from history, beside the live pipeline: the loop of one fill process.

The rules are :mod:`airflow_txn_provider.rules.filling`'s, the rows
:mod:`airflow_txn_provider.log.fill_progress`'s, a chunk's Spark work
:mod:`airflow_txn_provider.spark.fill`'s (given as ``compute``). :func:`fill_outputs` takes every
filling output of a pipeline over (raising its fencing token) and, until each has joined, computes
the next chunk of committed txids with the pipeline's ``transform``, or takes the rows the live
processing staged (computing where they are gone), and applies them in txid order in ONE
Postgres transaction that holds the outputs' rows (its fence) and the chunk's txid rows
(``FOR SHARE``: a rewind waits, or came first and the chunk is planned again). It joins under
the pipeline's lock once at most ``JOIN_GAP`` staged txids are left. A crash loses at most the
chunk in progress; each txid is applied as a live commit applies it
(:func:`~airflow_txn_provider.transactions.apply.apply_txid`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from airflow_txn_provider.log.expectations import stage_quarantined
from airflow_txn_provider.log.fill_progress import (
    advance,
    filling_outputs,
    join,
    lock_fill,
    take_over,
)
from airflow_txn_provider.log.models import PIPELINES, TRANSACTIONS
from airflow_txn_provider.log.rows import TxidRows, lock_pipeline
from airflow_txn_provider.rules.exceptions import StagedOutputMismatchError
from airflow_txn_provider.rules.filling import (
    FILL_CHUNK,
    FillProgress,
    FillStep,
    Step,
    join_gap,
    next_step,
)
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sinks.base import StagedFiles
from airflow_txn_provider.state import load_states
from airflow_txn_provider.transactions.apply import Outputs, SinkWrite, apply_txid, clean_up
from airflow_txn_provider.transactions.audit import Audit, audit_measured, audit_states
from airflow_txn_provider.transactions.rewind import read_rewound_through

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.rules.expectations import Expectation
    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.state import MapState
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

FILL_ATTEMPT = 0
"""The attempt a fill stages its computed rows under: no live attempt is 0, so they never mix
with rows the live processing staged for the same txid."""
FILL_JOB = "fill"


@dataclass(frozen=True)
class Committed:
    """A committed txid the fill computes: its batch's metadata and its committed attempt."""

    txid: int
    attempt: int
    metadata: Any


@dataclass
class ChunkResults:
    """A chunk's results: per txid, each filling state's rows and each filling sink's files,
    and what the sinks' expectations measured and dropped (as a live job records and stages)."""

    states: Mapping[int, Mapping[MapState, pa.Table]]
    sinks: Mapping[int, Mapping[LakeSink, StagedFiles]]
    measured: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    dropped: Mapping[int, Mapping[str, pa.Table]] = field(default_factory=dict)


ComputeChunk = Callable[
    [Sequence[Committed], Mapping[str, "MapState"], Sequence["MapState"], Sequence["LakeSink"]],
    ChunkResults,
]
"""Computes a chunk of committed txids (Spark's side): given every state of the pipeline by name
(the results are named after them), the filling states and sinks to compute."""


class _Replan(Exception):
    """The step's plan no longer holds (taken over, rewound, a txid not committed any more):
    its transaction rolls back and the fill reads its progress again."""


@dataclass
class FillReport:
    """What one :func:`fill_outputs` call did, per output."""

    computed: dict[str, int] = field(default_factory=dict)
    """Txids computed by the fill's own jobs."""
    applied_staged: dict[str, int] = field(default_factory=dict)
    """Txids applied from the rows the live processing staged."""
    joined_after: dict[str, int] = field(default_factory=dict)
    taken_over: list[str] = field(default_factory=list)
    """Outputs another fill process took over meanwhile (this one stopped filling them)."""
    rows: int = 0
    """Rows the fill's own jobs computed (every output's)."""
    seconds: float = 0.0


def fill_outputs(
    txlog: TransactionLog,
    pipeline: str,
    *,
    compute: ComputeChunk,
    sinks: Sequence[LakeSink] = (),
    chunk: int = FILL_CHUNK,
    wait: float = 1.0,
    on_progress: Callable[[str], None] | None = None,
    stopped: Callable[[], bool] | None = None,
    expectations: Sequence[Expectation] = (),
) -> FillReport:
    """Fill every output of ``pipeline`` that fills from history until each has joined the live
    commits (or was taken over by another fill). ``compute``: a chunk's results (called only
    where the live processing's staged rows cannot be applied). ``on_progress`` is called with a
    line per step (the task log's). ``expectations`` on the filled states audit each txid as its
    live commit would: ``warn`` and ``drop`` alike; a failed ``fail`` expectation stops the fill
    at that txid (:class:`~airflow_txn_provider.rules.exceptions.ExpectationsFailedError`; the
    txid stays committed, without the output, until the rule or data is fixed and the fill runs
    again)."""
    started = time.monotonic()
    report = FillReport()
    say = on_progress or (lambda line: log.info("pipeline=%s %s", pipeline, line))
    is_stopped = stopped or (lambda: False)
    with txlog.engine.begin() as conn:
        names = sorted(filling_outputs(conn, pipeline))
        mine = {n: p for n in names if (p := take_over(conn, pipeline, n)) is not None}
    if not mine:
        say("nothing to fill: no output of the pipeline fills from history")
        return report
    say(f"filling {sorted(mine)} from history")
    filler = _Filler(txlog, pipeline, compute, list(sinks), report, say, list(expectations))
    while mine and not is_stopped():
        last_committed = txlog.last_committed(pipeline)
        steps = {name: next_step(p, last_committed, chunk=chunk) for name, p in mine.items()}
        # The output furthest behind goes first, with every output at the same step.
        first = min(steps.values(), key=lambda s: s.first if s.first else last_committed + 1)
        group = sorted(n for n, s in steps.items() if s == first)
        if first.step is Step.WAIT:
            say(f"waiting for the txids begun before the declaration to commit ({group})")
            time.sleep(wait)
            mine = filler.reread(mine)  # a rewind may have moved the progress back
        else:
            try:
                mine.update(filler.run(first, {n: mine[n] for n in group}))
            except _Replan as why:
                say(f"planned again: {why}")
                mine = filler.reread(mine)
        for name in [n for n, p in mine.items() if not p.filling]:
            report.joined_after[name] = int(mine.pop(name).joined_after or 0)
    report.seconds = time.monotonic() - started
    return report


class _Filler:
    """The steps, each in its own Postgres transaction (see the module's docstring)."""

    def __init__(
        self,
        txlog: TransactionLog,
        pipeline: str,
        compute: ComputeChunk,
        sinks: list[LakeSink],
        report: FillReport,
        say: Callable[[str], None],
        expectations: list[Expectation],
    ) -> None:
        self.txlog, self.pipeline, self._compute = txlog, pipeline, compute
        self.report, self.say, self.expectations = report, say, expectations
        self.states = load_states(txlog.engine, pipeline)
        log_url = txlog.engine.url.render_as_string(hide_password=False)
        self.all = Outputs.open(pipeline, list(self.states.values()), sinks, log_url)

    def reread(self, mine: Mapping[str, FillProgress]) -> dict[str, FillProgress]:
        """The progress of the outputs still ours, read again (a rewind may have moved it)."""
        with self.txlog.engine.connect() as conn:
            recorded = filling_outputs(conn, self.pipeline)
        kept = {}
        for name, p in mine.items():
            rec = recorded.get(name)
            fill = rec.fill if rec is not None else None
            if fill is None or fill.attempt != p.attempt:
                self.report.taken_over.append(name)
                self.say(f"{name}: taken over by another fill, or no longer filling: stopped")
                continue
            kept[name] = fill
        return kept

    def outputs(self, names: Sequence[str]) -> Outputs:
        outputs = self.all.only(set(names))
        missing = set(names) - {s.name for s in outputs.states} - {s.name for s in outputs.sinks}
        if missing:
            raise _Replan(f"{sorted(missing)} not given to this fill (states, sinks): reloaded")
        return outputs

    def run(self, step: FillStep, mine: dict[str, FillProgress]) -> dict[str, FillProgress]:
        if step.step is Step.JOIN:
            return self.join(mine)
        if step.step is Step.COMPUTE:
            return self.compute(step, mine)
        if step.step is Step.APPLY_STAGED:
            try:
                return self.apply(step, mine, None)
            except StagedOutputMismatchError as err:
                self.say(f"txids {step.first}..{step.last}: {err.detail}; computed instead")
                return self.compute(step, mine)
        raise AssertionError(step)

    # -- compute ---------------------------------------------------------------------------------

    def committed(self, step: FillStep) -> list[Committed]:
        found = self.txlog.transactions(
            self.pipeline, since_txid=step.first - 1, limit=len(step.txids)
        )
        chunk = [Committed(t.txid, t.attempt, t.metadata) for t in found]
        if [c.txid for c in chunk] != list(step.txids) or any(
            t.status is not TxStatus.COMMITTED for t in found
        ):
            raise _Replan(f"txids {step.first}..{step.last} are not all committed now")
        return chunk

    def compute(self, step: FillStep, mine: dict[str, FillProgress]) -> dict[str, FillProgress]:
        started = time.monotonic()
        chunk = self.committed(step)
        outputs = self.outputs(sorted(mine))
        results = self._compute(chunk, self.states, outputs.states, outputs.sinks)
        rows = sum(t.num_rows for by in results.states.values() for t in by.values())
        rows += sum(f.rows for by in results.sinks.values() for f in by.values())
        done = self.apply(step, mine, results)
        self.report.rows += rows
        for name in mine:
            self.report.computed[name] = self.report.computed.get(name, 0) + len(chunk)
        self.say(
            f"txids {step.first}..{step.last} computed for {sorted(mine)} ({rows} rows, "
            f"{time.monotonic() - started:.1f} s)"
        )
        return done

    # -- apply -----------------------------------------------------------------------------------

    def apply(
        self, step: FillStep, mine: dict[str, FillProgress], computed: ChunkResults | None
    ) -> dict[str, FillProgress]:
        """Apply ``step``'s txids to the outputs of ``mine``, in a transaction of their own: the
        ``computed`` results, or the rows the live processing staged (``None``)."""
        with self.txlog.engine.begin() as conn:
            done, writes = self._apply_txids(conn, step, mine, computed)
        if computed is None:
            for name in mine:
                self.report.applied_staged[name] = self.report.applied_staged.get(name, 0) + len(
                    step.txids
                )
            self.say(f"txids {step.first}..{step.last} applied from staged rows to {sorted(mine)}")
        clean_up(self.pipeline, writes)
        return done

    def _apply_txids(
        self,
        conn: Connection,
        step: FillStep,
        mine: dict[str, FillProgress],
        computed: ChunkResults | None,
    ) -> tuple[dict[str, FillProgress], list[SinkWrite]]:
        """In ``conn``'s transaction: the fence, then each txid of ``step`` in order, then the
        progress. Returns the new progress and the lake files to clean up once it committed."""
        outputs = self.outputs(sorted(mine))
        writes: list[SinkWrite] = []
        locked = self._lock(conn, mine)
        attempts = self._share_committed(conn, step)
        rewound = read_rewound_through(conn, self.pipeline) if outputs.sinks else 0
        committed = _committed_through(conn, self.pipeline) if outputs.sinks else 0
        for txid in step.txids:
            attempt, output = attempts[txid]
            measured: Mapping[str, Any] = output  # a live job measured its sinks' rows
            if computed is not None:
                files_of = computed.sinks.get(txid, {})  # a Check on a sink reads its files
                measured = {
                    **computed.measured.get(txid, {}),
                    **{s.output_key: f.to_json() for s, f in files_of.items()},
                }
                for on, table in computed.dropped.get(txid, {}).items():
                    stage_quarantined(conn, self.pipeline, txid, attempt, on, table)
                rows: dict[str, int | None] = {}
                for state in outputs.states:
                    table = computed.states[txid][state]
                    state.stage_arrow(conn, txid, FILL_ATTEMPT, table, job=FILL_JOB)
                    rows[state.name] = table.num_rows
                files: dict[str, StagedFiles | None] = {
                    s.name: computed.sinks[txid][s] for s in outputs.sinks
                }
            else:
                rows = {s.name: _recorded_count(output, s.output_key) for s in outputs.states}
                files = {
                    s.name: _recorded_files(self.pipeline, txid, attempt, output, s)
                    for s in outputs.sinks
                }
            staged = FILL_ATTEMPT if computed is not None else attempt
            audit = Audit()
            sinks = [s.name for s in outputs.sinks]
            on_sinks = [e for e in self.expectations if e.on in sinks]
            audit_measured(
                conn, self.pipeline, sinks, on_sinks, measured, txid, attempt, audit=audit
            )
            audit_states(
                conn,
                outputs.states,
                [e for e in self.expectations if e.on in rows],
                txid,
                attempt,
                rows=rows,
                audit=audit,
                staged_attempt=staged,
            )
            if audit.outcomes:
                TxidRows(conn, self.pipeline, txid).record_expectations(
                    attempt, audit.records(), keep_others=True
                )
                rows = {
                    n: None if r is None else r - audit.dropped.get(n, 0) for n, r in rows.items()
                }
            applied = apply_txid(
                conn,
                outputs,
                txid,
                attempt,
                rows=rows,
                files=files,
                staged_attempt=staged,
                rewound_through=rewound,
                committed_through=committed,
                fill=True,
                computed=computed is not None,
            )
            writes += applied.writes
        done = {n: advance(conn, self.pipeline, p, step.last) for n, p in locked.items()}
        return done, writes

    def _lock(self, conn: Connection, mine: Mapping[str, FillProgress]) -> dict[str, FillProgress]:
        locked = {}
        for name, p in sorted(mine.items()):
            now = lock_fill(conn, self.pipeline, p)
            if now is None:
                raise _Replan(f"{name}: its progress moved (a rewind, or another fill)")
            locked[name] = now
        return locked

    def _share_committed(
        self, conn: Connection, step: FillStep
    ) -> dict[int, tuple[int, Mapping[str, Any]]]:
        """The committed attempts of ``step``'s txids with their recorded outputs, their rows
        held ``FOR SHARE`` (a rewind waits for this transaction, or came first: then they are not
        all committed)."""
        if not step.txids:
            return {}
        rows = conn.execute(
            select(
                TRANSACTIONS.c.txid,
                TRANSACTIONS.c.attempt,
                TRANSACTIONS.c.status,
                TRANSACTIONS.c.output,
            )
            .where(
                (TRANSACTIONS.c.pipeline == self.pipeline)
                & TRANSACTIONS.c.txid.between(step.first, step.last)
            )
            .with_for_update(read=True)
        ).all()
        found: dict[int, tuple[int, Mapping[str, Any]]] = {
            int(r.txid): (int(r.attempt), dict(r.output or {}))
            for r in rows
            if r.status is TxStatus.COMMITTED
        }
        if sorted(found) != list(step.txids):
            raise _Replan(f"txids {step.first}..{step.last} are not all committed now")
        return found

    # -- join ------------------------------------------------------------------------------------

    def join(self, mine: dict[str, FillProgress]) -> dict[str, FillProgress]:
        """Under the pipeline's lock: apply the last staged txids (at most ``JOIN_GAP``) and join,
        or let go and apply them outside first."""
        with self.txlog.engine.begin() as conn:
            last = int(lock_pipeline(conn, self.pipeline).last_committed_txid)
            gaps = {n: join_gap(p, last) for n, p in mine.items()}
            if any(g is None for g in gaps.values()):
                return mine  # more has committed meanwhile: the next steps apply it first
            gap = next(iter(gaps.values()))
            if gap is None or any(g != gap for g in gaps.values()):
                return mine
            if gap:
                try:
                    with conn.begin_nested():
                        step = FillStep(Step.APPLY_STAGED, gap.start, gap[-1])
                        mine = self._apply_in(conn, step, mine)
                except StagedOutputMismatchError:
                    return mine  # the next step computes them, outside the lock
            locked = self._lock(conn, mine)
            for p in locked.values():
                join(conn, self.pipeline, p, last)
        self.say(f"{sorted(mine)} joined the live commits after txid {last}")
        return {
            n: FillProgress(p.output, p.live_from, last, p.attempt, last) for n, p in mine.items()
        }

    def _apply_in(
        self, conn: Connection, step: FillStep, mine: dict[str, FillProgress]
    ) -> dict[str, FillProgress]:
        """:meth:`apply` of staged rows inside the join's transaction (a savepoint)."""
        done, writes = self._apply_txids(conn, step, mine, None)
        clean_up(self.pipeline, writes)
        return done


def _committed_through(conn: Connection, pipeline: str) -> int:
    """The log's last committed txid of ``pipeline`` (every txid a fill applies is at most it)."""
    row = conn.execute(
        select(PIPELINES.c.last_committed_txid).where(PIPELINES.c.name == pipeline)
    ).one()
    return int(row.last_committed_txid)


def _recorded_count(output: Mapping[str, Any], key: str) -> int:
    count = output.get(key)
    if not isinstance(count, int):
        # processed without the output (a version of the pipeline that did not declare it)
        return -1  # never equal to a count: the staged rows are computed again
    return count


def _recorded_files(
    pipeline: str, txid: int, attempt: int, output: Mapping[str, Any], sink: LakeSink
) -> StagedFiles | None:
    files = output.get(sink.output_key)
    if not isinstance(files, Mapping) or "directory" not in files:
        raise StagedOutputMismatchError(
            f"lake sink {sink.name!r}: the txid's recorded output has no staged files for it",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    staged = StagedFiles.from_json(files)
    if not staged.exists():
        raise StagedOutputMismatchError(
            f"lake sink {sink.name!r}: the staged files {staged.directory} are gone",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    return staged


__all__ = [
    "FILL_ATTEMPT",
    "ChunkResults",
    "Committed",
    "ComputeChunk",
    "FillReport",
    "fill_outputs",
]
