"""The processing step of one txid, shared by every Spark job and both submission paths.

A job in ``spark_jobs/`` is a pure ``transform(batch) -> DataFrame`` plus ``main(argv)`` that
returns ``run_job(argv, transform)``. :func:`run_job` is what ``spark-submit`` runs: it parses the
arguments (:class:`BatchJob`), creates the session, then calls :func:`process_batch`. The Spark
Connect path calls :func:`process_batch` directly with a remote session, in the Airflow worker.

:func:`process_batch` reads the batch that the log recorded for ``(txid, attempt)``, refuses
malformed records (naming their location), runs the transform on Spark, collects the partial
results as Arrow and stages them in Postgres fenced by ``(txid, attempt)``: an attempt that is no
longer current stages nothing, so an old attempt's output can never be committed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from airflow_txn_provider.compat.spark import to_arrow
from airflow_txn_provider.log.expectations import stage_quarantined
from airflow_txn_provider.log.rows import TxidRows
from airflow_txn_provider.rules.exceptions import (
    IncompleteBatchError,
    MalformedRecordError,
    NotBegunError,
    ProcessingError,
    ProcessingStoppedError,
    StateDefinitionError,
    TxnError,
)
from airflow_txn_provider.rules.expectations import Expectation
from airflow_txn_provider.rules.fencing import attempt_may_stage
from airflow_txn_provider.rules.records import TxRecord
from airflow_txn_provider.rules.vocabulary import ProcessedAction
from airflow_txn_provider.sinks.base import LakeSink, StagedFiles, sink_from_spec
from airflow_txn_provider.sinks.staging import stage_frame
from airflow_txn_provider.sources.base import LOCATION, RECORD, SparkSource, source_from_spec
from airflow_txn_provider.sources.catalog import with_log_catalog
from airflow_txn_provider.spark import audit
from airflow_txn_provider.spark.cores import is_connect, tell_spark_cores
from airflow_txn_provider.spark.work_slots import spark_work_slot
from airflow_txn_provider.state import MapState, counted_states, load_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.utils import metrics
from airflow_txn_provider.utils.redaction import RedactingFilter, register_secret

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

LOG_URL_ENV = "TXN_LOG_URL"
"""Environment variable with the transaction log's SQLAlchemy URL. Not an argument: a command
line is visible to every local user and printed in logs; the environment is not."""

CONNECT_MODE_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
"""What PySpark sets in a process once it opens a remote session, and never unsets."""

Transform = Callable[["DataFrame"], "DataFrame | Mapping[str, DataFrame]"]
"""A pure function from the batch to partial results: one DataFrame of ``(keys…, delta)`` per
state (a mapping ``{state name: DataFrame}``, or one DataFrame when the pipeline has one state)."""


@dataclass(frozen=True)
class BatchJob:
    """What a processing job is asked to do: process ``(pipeline, txid, attempt)`` from ``source``.

    :param finish: record the processed output when staging is done (the default). ``False`` when
        several jobs process parts of one txid; the last step then calls
        :func:`airflow_txn_provider.transactions.commit.record_processed`.
    :param sinks: the pipeline's lake sinks (:mod:`airflow_txn_provider.sinks`): outputs that
        Spark's executors write as Parquet files, recorded with the attempt's output.
    :param fit_window: the pipeline's window fits its Spark (it declares no ``max_pending``):
        once processed, the job tells the log how many cores its Spark offers
        (:meth:`~airflow_txn_provider.transactions.declaration.PipelineDeclarations.fit_window`).
    :param expectations: those on the input batch and the lake sinks, measured by the job
        (:mod:`airflow_txn_provider.spark.audit`) and judged by the commit.
    """

    pipeline: str
    txid: int
    attempt: int
    source: SparkSource
    finish: bool = True
    sinks: tuple[LakeSink, ...] = ()
    fit_window: bool = False
    expectations: tuple[Expectation, ...] = ()

    def __post_init__(self) -> None:
        if not self.pipeline:
            raise ValueError("pipeline must not be empty")
        if self.txid < 1 or self.attempt < 1:
            raise ValueError(f"txid and attempt must be >= 1, got {self.txid}, {self.attempt}")
        object.__setattr__(self, "sinks", tuple(self.sinks))
        object.__setattr__(self, "expectations", tuple(self.expectations))

    @property
    def where(self) -> dict[str, Any]:  # what the typed errors name
        return {"pipeline": self.pipeline, "txid": self.txid, "attempt": self.attempt}

    @property
    def app_name(self) -> str:
        return f"txn:{self.pipeline}:txid-{self.txid:06d}:attempt-{self.attempt}"

    def to_args(self) -> list[str]:
        source = json.dumps(self.source.to_spec(), sort_keys=True)
        args = ["--pipeline", self.pipeline, "--txid", str(self.txid), "--attempt"]
        args += [str(self.attempt), "--source", source]
        if self.sinks:
            args += ["--sinks", json.dumps([s.to_spec() for s in self.sinks], sort_keys=True)]
        if self.fit_window:
            args.append("--fit-window")
        args += audit.to_arg(self.expectations)
        return args if self.finish else [*args, "--no-finish"]

    @classmethod
    def from_args(cls, argv: Sequence[str]) -> BatchJob:
        """Parse job arguments; raises ``SystemExit(2)`` with a usage message on bad input."""
        parser = argparse.ArgumentParser(
            prog=os.path.basename(sys.argv[0]) or "txn-job",
            description="Process one txid's batch and stage its results in the transaction log. "
            f"The log's URL comes from ${LOG_URL_ENV}.",
        )
        parser.add_argument("--pipeline", required=True)
        parser.add_argument("--txid", required=True, type=int)
        parser.add_argument("--attempt", required=True, type=int)
        parser.add_argument("--source", required=True, help="JSON from SparkSource.to_spec()")
        parser.add_argument("--no-finish", dest="finish", action="store_false")
        parser.add_argument("--sinks", default="[]", help="JSON list of LakeSink.to_spec()")
        parser.add_argument("--fit-window", action="store_true", help="report Spark's cores")
        parser.add_argument("--expectations", default="[]", help="JSON list: spark/audit.py")
        ns = parser.parse_args(list(argv))
        try:
            source = source_from_spec(ns.source)
            sinks = tuple(sink_from_spec(spec) for spec in json.loads(ns.sinks))
            job = cls(ns.pipeline, ns.txid, ns.attempt, source, ns.finish, sinks, ns.fit_window)
            return replace(job, expectations=audit.from_arg(ns.expectations))
        except (ValueError, TypeError) as err:
            parser.error(str(err))
            raise  # unreachable: parser.error exits


@dataclass(frozen=True)
class ProcessOutcome:
    """What :func:`process_batch` did."""

    job: BatchJob
    status: str
    """``processed`` (output recorded), ``staged`` (``finish=False``), ``stale`` (none staged)."""
    staged_rows: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def process_batch(
    spark: SparkSession,
    txlog: TransactionLog,
    job: BatchJob,
    transform: Transform,
    *,
    timings: Mapping[str, float] | None = None,
    holder: str | None = None,
    stopped: Callable[[], bool] | None = None,
) -> ProcessOutcome:
    """Process one txid's batch on ``spark`` and stage the results, fenced by ``(txid, attempt)``.

    Any failure fails ``(txid, attempt)`` in the log (and, by the cascade, every later txid in
    flight) and raises a :class:`TxnError` naming them; nothing is staged for commit. Not when
    the failure is reported by ``holder`` (this process's lease holder name) while another
    process holds the attempt's lease, nor once ``stopped()`` (this run was told to stop: its
    interrupted Spark work is no failure of the attempt): it then raises
    :class:`~airflow_txn_provider.rules.exceptions.ProcessingStoppedError` before its next Spark
    action or its staging.

    The attempt's timings (seconds) are recorded with its output: ``start`` (its begin to this
    job's start), ``spark_slot`` (:mod:`~airflow_txn_provider.spark.work_slots`), ``spark`` (read,
    transform, collect), ``staging`` (the COPY into Postgres), and the caller's (``connect``).
    """
    started = time.monotonic()
    spent: dict[str, float] = dict(timings or {})
    info = txlog.transaction(job.pipeline, job.txid)
    if info is None:
        raise NotBegunError(
            "no such txid in the log", pipeline=job.pipeline, txid=job.txid, attempt=job.attempt
        )
    record = TxRecord(info.txid, info.attempt, info.status, info.metadata, info.output)
    if not attempt_may_stage(record, pipeline=job.pipeline, txid=job.txid, attempt=job.attempt):
        log.warning(
            "%s: nothing to do, current attempt is %s (%s)", job.app_name, info.attempt, info.status
        )
        return ProcessOutcome(job, "stale", seconds=time.monotonic() - started)
    log.info("%s: processing batch %s", job.app_name, json.dumps(info.metadata))
    if info.begun_at is not None:
        spent["start"] = max(0.0, time.time() - info.begun_at.timestamp() - sum(spent.values()))
    computing = time.monotonic()
    is_stopped = stopped or (lambda: False)
    where: dict[str, Any] = {"pipeline": job.pipeline, "txid": job.txid, "attempt": job.attempt}

    def check() -> None:  # before each Spark action and the staging: a stopped run goes no further
        if is_stopped():
            raise ProcessingStoppedError("stopped: its failure is not reported", **where)

    def report(error: TxnError) -> None:
        if is_stopped():  # the error is the interruption's: whoever stopped the run decides
            log.warning("%s stopped, not reported as failed: %s", job.app_name, error)
        else:
            txlog.fail(**where, error=str(error), of_processing=True, holder=holder)

    try:
        with spark_work_slot(txlog, job, spent):  # fitted window: one txid's Spark work a core
            computing = time.monotonic()
            computed = _compute(spark, txlog, job, info.metadata, transform, check)
        check()
    except TxnError as err:
        report(err)
        raise
    except Exception as err:
        error = ProcessingError(
            f"processing failed: {type(err).__name__}: {_first_line(err)}", **where
        )
        report(error)
        raise error from err

    spent["spark"] = time.monotonic() - computing
    tables, staged, measured, dropped = computed
    counts: dict[str, int] = {}
    # Several jobs of one txid may stage into the same state: each replaces only its own rows.
    name = job_name(transform)

    def stage(conn: Any) -> dict[str, Any]:
        staging = time.monotonic()
        for state, table in tables.items():
            counts[state.output_key] = state.stage_arrow(
                conn, job.txid, job.attempt, table, job=name
            )
        output: dict[str, Any] = {**counts, **measured}  # measured: the audit's, for the commit
        for on, rows in dropped.items():  # a drop's rows, for the commit to quarantine
            stage_quarantined(conn, job.pipeline, job.txid, job.attempt, on, rows)
        # A duplicate run of an attempt whose output is recorded keeps the recorded files (a
        # transactional replay's rows are the same): its own are discarded below.
        rows = TxidRows(conn, job.pipeline, job.txid)
        earlier = rows.recorded_output(job.attempt) if staged else None
        for sink, files in staged.items():  # written by the executors already: listed here
            counts[sink.output_key] = files.rows
            output[sink.output_key] = (earlier or {}).get(sink.output_key) or files.to_json()
        if job.finish:  # every counted state gets a count, zero included
            for key in counted_states(conn, job.pipeline):
                counts.setdefault(key, 0)
                output.setdefault(key, 0)
        spent["staging"] = time.monotonic() - staging
        return output

    if job.finish:
        action = txlog.stage_output(job.pipeline, job.txid, job.attempt, stage, timings=spent)
        status = "stale" if action is ProcessedAction.IGNORE_STALE else "processed"
    else:
        # Several jobs: each job's timings under its own name.
        mine = {f"{name.split(':')[0]}.{k}": v for k, v in spent.items()}
        done = txlog.stage(job.pipeline, job.txid, job.attempt, stage, job=name, timings=mine)
        status = "staged" if done else "stale"
    if staged:
        _discard_unrecorded(txlog, job, staged)
    if job.fit_window and status != "stale":
        tell_spark_cores(spark, txlog, job.pipeline, job.app_name)
    outcome = ProcessOutcome(job, status, counts, time.monotonic() - started)
    if status != "stale":
        metrics.timing(metrics.PROCESSING_DURATION, job.pipeline, outcome.seconds, job=name)
    log.info("%s: %s in %.2fs, staged %s", job.app_name, status, outcome.seconds, counts)
    return outcome


def _discard_unrecorded(
    txlog: TransactionLog, job: BatchJob, staged: Mapping[LakeSink, StagedFiles]
) -> None:
    """Delete what this run staged for the lake sinks unless the log recorded it (a stale
    attempt, a duplicate run): garbage now, and the txid's commit may have cleaned up already."""
    info = txlog.transaction(job.pipeline, job.txid)
    output = (info.output if info is not None and info.attempt == job.attempt else None) or {}
    for sink, files in staged.items():
        if (output.get(sink.output_key) or {}).get("directory") != files.directory:
            files.discard()


def job_name(transform: Callable[..., Any]) -> str:
    """A name for the job running ``transform``, the same in every process that runs that job:
    its file's stem, qualified name and line (a job file's ``transform`` is ``word_count:
    transform:12``; two lambdas of one test file differ by line)."""
    code = getattr(transform, "__code__", None)
    qualname = getattr(transform, "__qualname__", type(transform).__qualname__)
    if code is None:
        return f"{getattr(transform, '__module__', '?')}:{qualname}"
    stem = os.path.splitext(os.path.basename(code.co_filename))[0]
    return f"{stem}:{qualname}:{code.co_firstlineno}"


def _compute(
    spark: SparkSession,
    txlog: TransactionLog,
    job: BatchJob,
    metadata: Any,
    transform: Transform,
    check: Callable[[], None] = lambda: None,
) -> tuple[
    dict[MapState, pa.Table], dict[LakeSink, StagedFiles], dict[str, Any], dict[str, pa.Table]
]:
    """Run the Spark side: read, check, transform, collect the states' partial results, and
    write the lake sinks' output from the executors. Takes no lock in Postgres. ``check()``
    before each Spark action (it raises once the run is stopped)."""
    check()
    states = load_states(txlog.engine, job.pipeline)
    source = with_log_catalog(job.source, txlog.engine)  # its files, as the begin found them
    batch = source.read_batch(spark, metadata)
    malformed = source.malformed_records(batch)
    if malformed is not None:
        check()
        bad = malformed.limit(1).collect()
        if bad:
            location, record = bad[0][LOCATION], bad[0][RECORD]
            raise MalformedRecordError(
                f"malformed record {_excerpt(record)}",
                **job.where,
                location=source.describe_location(location, record),
            )
    counts = source.batch_counts(metadata)  # none: nothing to count, or proven already
    observation, observed = _observe_counts(spark, job, batch, counts)
    if counts and observation is None:
        _refuse_mismatch(job, source.batch_mismatch(batch, metadata))
    audited = audit.JobAudit(job.expectations, check)  # drops: taken out before use
    results = transform(audited.input(source, source.records(batch), source.records(observed)))
    by_state, by_sink = results_by_output(results, states, job)
    by_sink = {sink: audited.sink(sink, frame) for sink, frame in by_sink.items()}

    tables = {}
    for state, frame in by_state.items():
        check()
        tables[state] = to_arrow(frame)
    staged = {}
    if by_sink:
        log_url = txlog.engine.url.render_as_string(hide_password=False)
        for sink, frame in by_sink.items():
            check()
            staged[sink] = stage_frame(spark, frame, sink, log_url=log_url, **job.where)
    if observation is not None:
        from pyspark.errors import PySparkAssertionError

        try:
            counts = observation.get
        except PySparkAssertionError:
            counts = {}
        if counts:
            _refuse_mismatch(job, job.source.counts_mismatch(counts, metadata))
        else:  # the transform never read the batch it was given: count in a pass of their own
            _refuse_mismatch(job, job.source.batch_mismatch(batch, metadata))
    return tables, staged, audited.measured, audited.dropped_rows()


def _observe_counts(
    spark: SparkSession, job: BatchJob, batch: DataFrame, counts: Mapping[str, Any] | None
) -> tuple[Any, DataFrame]:
    """On Spark Connect, the batch with the source's completeness ``counts`` observed while the
    transform runs: one pass over the batch instead of two. Classic
    sessions count in a pass of their own: there, reading an observation the transform never
    ran would block forever."""
    if not counts or not is_connect(spark):
        return None, batch
    from pyspark.sql import Observation

    observation = Observation(f"txn_batch_{job.txid}_{job.attempt}")
    columns = [column.alias(name) for name, column in counts.items()]
    return observation, batch.observe(observation, *columns)


def _refuse_mismatch(job: BatchJob, mismatch: str | None) -> None:
    if mismatch is not None:
        raise IncompleteBatchError(
            f"the batch read is not the batch its metadata describes: {mismatch}",
            **job.where,
        )


def results_by_output(
    results: Any, all_states: Mapping[str, MapState], job: BatchJob
) -> tuple[dict[MapState, DataFrame], dict[LakeSink, DataFrame]]:
    """The transform's DataFrames by the state or lake sink they are for."""
    # Derived states (bucket counts) are computed at commit time: a job never stages them.
    outputs: dict[str, MapState | LakeSink] = {
        name: s for name, s in all_states.items() if s.derived_from is None
    }
    outputs.update({sink.name: sink for sink in job.sinks})
    if not isinstance(results, Mapping):
        if len(outputs) != 1:
            raise StateDefinitionError(
                f"the transform returned one DataFrame but pipeline has outputs {sorted(outputs)}: "
                "return {output name: DataFrame}",
                **job.where,
            )
        results = {next(iter(outputs)): results}
    unknown = sorted(set(results) - set(outputs))
    if unknown:
        raise StateDefinitionError(
            f"the transform returned results for unknown output(s) {unknown}; pipeline has "
            f"{sorted(outputs)}",
            **job.where,
        )
    by_state: dict[MapState, DataFrame] = {}
    by_sink: dict[LakeSink, DataFrame] = {}
    for name, frame in results.items():
        target = outputs[name]
        if isinstance(target, LakeSink):
            by_sink[target] = frame
        else:
            by_state[target] = frame
    return by_state, by_sink


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit): \S.*$")
"""The last line of a Python traceback: the exception a Spark Python worker raised."""


def _first_line(err: BaseException) -> str:
    """What failed, in one line: the error's first line; for a Spark Python worker's error
    (``PythonException``: "An exception was thrown from the Python worker…" and the worker's
    traceback), the exception the worker raised, which says what went wrong."""
    text = str(err).strip()
    lines = text.splitlines()
    if "Traceback (most recent call last)" in text:
        raised = [line.strip() for line in lines if _RAISED.match(line.strip())]
        if raised:
            return raised[-1][:500]
    return lines[0][:500] if lines else ""


def _excerpt(record: str, limit: int = 200) -> str:
    return repr(record if len(record) <= limit else record[:limit] + "…")


# -- the program ---------------------------------------------------------------------------------


def create_session(job: BatchJob) -> SparkSession:
    """The session of a ``spark-submit``ted job: master and settings come from spark-submit."""
    from pyspark.sql import SparkSession

    # Inherited from a process that once opened a Spark Connect session (an Airflow worker using
    # the fast path too), these would turn this classic driver into a Connect client. Dropped
    # here, in the job, because SparkSubmitHook always starts the job from its own os.environ.
    for name in CONNECT_MODE_ENV:
        os.environ.pop(name, None)
    return SparkSession.builder.appName(job.app_name).getOrCreate()


def run_job(
    argv: Sequence[str] | None,
    transform: Transform,
    *,
    session_factory: Callable[[BatchJob], SparkSession] = create_session,
) -> int:
    """Entry point of a ``spark-submit``ted processing job; returns the process exit code.

    0: processed (or nothing to do for a stale attempt); 1: processing failed (the txid is failed
    in the log with the reason); 2: bad arguments or environment.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:  # its lines reach task logs and executors'
        handler.addFilter(RedactingFilter())
    try:
        job = BatchJob.from_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    url = os.environ.get(LOG_URL_ENV)
    if not url:
        print(f"error: ${LOG_URL_ENV} is not set (the transaction log's URL)", file=sys.stderr)
        return 2
    register_secret(make_url(url).password)
    txlog = TransactionLog.from_url(url, migrate=False)
    spark = session_factory(job)
    try:
        outcome = process_batch(spark, txlog, job, transform)
    except TxnError as err:
        log.error("%s", err)
        return 1
    finally:
        spark.stop()
        txlog.engine.dispose()
    print(json.dumps({"status": outcome.status, "staged_rows": dict(outcome.staged_rows)}))
    return 0
