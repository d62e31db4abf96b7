"""Filling outputs from history, beside the live pipeline: the loop of one fill process.

The rules are :mod:`airflow_txn_provider.rules.filling`'s (what comes next, when to join); the
rows :mod:`airflow_txn_provider.log.fill_progress`'s; the Spark side
:mod:`airflow_txn_provider.spark.fill_job`'s. :func:`fill_pipeline` takes every filling output
of a pipeline over (raising its fencing token) and, step by step until each has joined:

* computes the next chunk of committed txids with the pipeline's own ``transform`` (Spark), then
  applies them to the filling outputs in txid order in ONE Postgres transaction that holds the
  outputs' rows (its fence) and the chunk's txid rows (``FOR SHARE``: a rewind waits for it, or
  came first and the chunk is planned again);
* applies the rows the live processing staged (txids begun after the declaration), the same way,
  with no Spark at all; where they are gone (UNLOGGED staging after a Postgres crash, a lake
  directory cleaned) it computes those txids instead;
* joins under the pipeline's lock once nothing, or at most ``JOIN_GAP`` staged txids, is left:
  the live commits then apply the outputs with every other one.

A crash anywhere loses at most the chunk in progress: the progress is the log's, and the chunk's
writes commit with it or not at all (a lake table's commit of a txid is found there by the
retry, which does not write it twice). Each state is applied by its kind's rule
(:meth:`~airflow_txn_provider.state.MapState.apply`), so its bookkeeping columns and undo
records are exactly those its live commits would have written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

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
from airflow_txn_provider.rules.vocabulary import SinkAction, TxStatus
from airflow_txn_provider.sinks.base import SINK_SPEC, StagedFiles
from airflow_txn_provider.spark.fill_job import Committed, compute_chunk
from airflow_txn_provider.state import load_states
from airflow_txn_provider.transactions.rewind import read_rewound_through

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.spark.job import Transform
    from airflow_txn_provider.spark.sources import SparkSource
    from airflow_txn_provider.state import MapState
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

FILL_ATTEMPT = 0
"""The attempt a fill stages its computed rows under: no live attempt is 0, so they never mix
with rows the live processing staged for the same txid."""
FILL_JOB = "fill"


Computed = tuple[
    Mapping[int, Mapping["MapState", "pa.Table"]], Mapping[int, Mapping["LakeSink", StagedFiles]]
]
"""A chunk's results, per txid: each state's rows, each lake sink's files."""


_SinkApplied = tuple["LakeSink", int, "StagedFiles | None", bool, bool]
"""One txid's commit to a lake sink in a step: the sink, the txid, the files it was given,
whether the step computed them (else the live processing staged them), and whether the table
held the txid already."""


class _Replan(Exception):
    """The step's plan no longer holds (taken over, rewound, a txid not committed any more):
    its transaction rolls back and the fill reads its progress again."""


@dataclass
class FillReport:
    """What one :func:`fill_pipeline` call did, per output."""

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


def fill_pipeline(
    txlog: TransactionLog,
    pipeline: str,
    *,
    spark: SparkSession | Callable[[], SparkSession],
    source: SparkSource,
    transforms: Sequence[Transform],
    sinks: Sequence[LakeSink] = (),
    chunk: int = FILL_CHUNK,
    wait: float = 1.0,
    on_progress: Callable[[str], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> FillReport:
    """Fill every output of ``pipeline`` that fills from history until each has joined the live
    commits (or was taken over by another fill). ``spark``: a session, or a factory called once
    the first txid needs computing (a fill that applies staged rows only needs none);
    ``transforms``: the pipeline's jobs' (each computes some of its outputs).
    ``on_progress`` is called with a line per step (the task log's)."""
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
    filler = _Filler(txlog, pipeline, spark, source, list(transforms), list(sinks), report, say)
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
        spark: SparkSession | Callable[[], SparkSession],
        source: SparkSource,
        transforms: list[Transform],
        sinks: list[LakeSink],
        report: FillReport,
        say: Callable[[str], None],
    ) -> None:
        self.txlog, self.pipeline, self._spark = txlog, pipeline, spark
        self.source, self.transforms, self.sinks = source, transforms, sinks
        self.report, self.say = report, say
        self.log_url = txlog.engine.url.render_as_string(hide_password=False)
        self.states = load_states(txlog.engine, pipeline)
        self.tables = {sink: sink.open(self.log_url) for sink in sinks}

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

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

    def outputs(self, names: Sequence[str]) -> tuple[list[MapState], list[LakeSink]]:
        states = [self.states[n] for n in names if n in self.states]
        sinks = [s for s in self.sinks if s.name in names]
        missing = set(names) - {s.name for s in states} - {s.name for s in sinks}
        if missing:
            raise _Replan(f"{sorted(missing)} not given to this fill (states, sinks): reloaded")
        return states, sinks

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
        states, sinks = self.outputs(sorted(mine))
        results = compute_chunk(
            self.spark,
            pipeline=self.pipeline,
            source=self.source,
            transforms=self.transforms,
            chunk=chunk,
            all_states=self.states,
            all_sinks=self.sinks,
            states=states,
            sinks=sinks,
            log_url=self.log_url,
        )
        rows = sum(t.num_rows for by in results.states.values() for t in by.values())
        rows += sum(f.rows for by in results.sinks.values() for f in by.values())
        done = self.apply(step, mine, (results.states, results.sinks))
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
        self, step: FillStep, mine: dict[str, FillProgress], computed: Computed | None
    ) -> dict[str, FillProgress]:
        """Apply ``step``'s txids to the outputs of ``mine``, in a transaction of their own: the
        ``computed`` results, or the rows the live processing staged (``None``)."""
        with self.txlog.engine.begin() as conn:
            done, staged_files = self._apply_txids(conn, step, mine, computed)
        if computed is None:
            for name in mine:
                self.report.applied_staged[name] = self.report.applied_staged.get(name, 0) + len(
                    step.txids
                )
            self.say(f"txids {step.first}..{step.last} applied from staged rows to {sorted(mine)}")
        self._cleanup(staged_files)
        return done

    def _apply_txids(
        self,
        conn: Connection,
        step: FillStep,
        mine: dict[str, FillProgress],
        computed: Computed | None,
    ) -> tuple[dict[str, FillProgress], list[_SinkApplied]]:
        """In ``conn``'s transaction: the fence, then each txid of ``step`` in order, then the
        progress. Returns the new progress and the lake files to clean up once it committed."""
        states, sinks = self.outputs(sorted(mine))
        staged_files: list[_SinkApplied] = []
        locked = self._lock(conn, mine)
        attempts = self._share_committed(conn, step)
        rewound = read_rewound_through(conn, self.pipeline) if sinks else 0
        committed = _committed_through(conn, self.pipeline) if sinks else 0
        for txid in step.txids:
            attempt, output = attempts[txid]
            for state in states:
                if computed is not None:
                    table = computed[0][txid][state]
                    state.stage_arrow(conn, txid, FILL_ATTEMPT, table, job=FILL_JOB)
                    state.apply(conn, txid, FILL_ATTEMPT, expected_rows=table.num_rows)
                else:
                    expected = _recorded_count(output, state.output_key)
                    state.apply(conn, txid, attempt, expected_rows=expected)
            for sink in sinks:
                if computed is not None:
                    files: StagedFiles | None = computed[1][txid][sink]
                else:
                    files = _recorded_files(self.pipeline, txid, attempt, output, sink)
                fresh = computed is not None
                already = self._commit_sink(
                    conn,
                    sink,
                    txid,
                    attempt,
                    files,
                    rewound=rewound,
                    committed=committed,
                    fresh=fresh,
                )
                staged_files.append((sink, txid, files, fresh, already))
        done = {n: advance(conn, self.pipeline, p, step.last) for n, p in locked.items()}
        return done, staged_files

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

    def _commit_sink(
        self,
        conn: Connection,
        sink: LakeSink,
        txid: int,
        attempt: int,
        files: StagedFiles | None,
        *,
        rewound: int,
        committed: int,
        fresh: bool,
    ) -> bool:
        """Commit ``txid`` to ``sink``'s table and record it; whether the table held it already.
        ``rewound``: the newest txid a rewind failed; ``committed``: the log's last committed
        txid (a table may hold up to it: a killed fill's commits); ``fresh``: the step computed
        ``files`` (else the live processing staged them)."""
        done = sink.commit(
            self.tables[sink],
            self.pipeline,
            txid,
            attempt,
            files,
            rewound_through=rewound,
            committed_through=committed,
        )
        already = done.action == SinkAction.ALREADY_IN_TABLE
        # A table that held the txid already (a killed fill's commit) references the files it
        # was given then: freshly computed ones are not recorded, and go once this step commits.
        recorded = files.to_json() if files and not (already and fresh) else {}
        # recorded as a live commit records it: a rewind over this txid follows the table too
        patch = {sink.output_key: {**recorded, "commit": done.to_json(), SINK_SPEC: sink.to_spec()}}
        TxidRows(conn, self.pipeline, txid).patch_output(attempt, patch)
        return already

    def _cleanup(self, applied: list[_SinkApplied]) -> None:
        """Delete the staged files no table references, once the step committed. Where the table
        held the txid already, it references the files a killed fill committed, not these: only
        the ones this step computed go (the live processing's are left alone)."""
        for sink, txid, files, fresh, already in applied:
            try:
                if not already:
                    sink.cleanup(self.pipeline, txid, files)
                elif fresh and files is not None:
                    files.discard()
            except Exception as err:  # garbage left behind is not data lost
                log.warning("pipeline=%s txid=%s %s cleanup: %s", self.pipeline, txid, sink, err)

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
        done, staged_files = self._apply_txids(conn, step, mine, None)
        self._cleanup(staged_files)
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


__all__ = ["FILL_ATTEMPT", "FillReport", "fill_pipeline"]
