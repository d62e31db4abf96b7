"""A processing worker of the fast chaos tier: one process per attempt, as an Airflow task is.

``python -m chaos.worker --pipeline P --txid T --attempt A --source JSON --spark-url sc://…
[--sink JSON --state NAME]`` (the log's URL in ``$TXN_LOG_URL``) processes one attempt on Spark
Connect under a :class:`~airflow_txn_provider.transactions.lease.LeaseKeeper`, exactly as the Spark
Connect path of the processing operator does, with its runner
(:class:`~airflow_txn_provider.operators.spark_runner.SparkConnectRunner`: the pipeline's slot
session, :func:`~airflow_txn_provider.spark.job.process_batch` (read, transform, stage fenced by the
attempt, mark processed), the session released if the attempt failed). If the attempt is
failed meanwhile, the keeper interrupts the run's Spark work. SIGTERM does what Airflow's task
runner does with it: the operator's ``on_kill`` (the lease abandoned, the run's own Spark work
interrupted, no failure reported), and the worker goes on until its work ends.

``--job PATH``: a job file whose ``transform`` to run instead of ``spark_jobs/word_count.py``.

With ``--sink`` (a :meth:`~airflow_txn_provider.sinks.LakeSink.to_spec`), the job also writes
the word count into that lake sink: the executors stage it as Parquet in the attempt's own
directory, recorded with the attempt's output (``BatchJob(..., sinks=(sink,))``); ``--state``
names the map state that gets the same word count, as before.

With ``--jobs 2`` the attempt is processed as a txid of two jobs is: two Spark jobs (the words
before ``m`` and the rest, both into the one map state, each staged with ``finish=False``
under its own job name), then :func:`~airflow_txn_provider.transactions.commit.record_processed`.

``--pause-at staging|between_jobs --pause-file F``: on reaching that point (inside the staging
transaction, after the COPY; or after the first of two jobs staged) the worker creates
``F.paused`` and waits (up to :data:`PAUSE_LIMIT` seconds) for ``F.go``: the driver kills a
Postgres backend meanwhile (the ``kill_backend`` fault).

Exit codes: 0 processed (or the attempt was stale: nothing to do), 1 processing failed (the log
has the reason) or stopped by SIGTERM (it prints ``{"status": "stopped"}``), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner, load_job_module
from airflow_txn_provider.rules.exceptions import TxnError
from airflow_txn_provider.sinks import LakeSink, sink_from_spec
from airflow_txn_provider.sources.base import source_from_spec
from airflow_txn_provider.spark.job import LOG_URL_ENV, BatchJob, ProcessOutcome, Transform
from airflow_txn_provider.transactions.lease import LeaseKeeper, holder_name
from airflow_txn_provider.transactions.transaction_log import TransactionLog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("chaos.worker")

ROOT = Path(__file__).resolve().parents[1]
WORD_COUNT = ROOT / "spark_jobs" / "word_count.py"
PAUSE_POINTS = ("staging", "between_jobs")
PAUSE_LIMIT = 30.0
"""Seconds a paused worker waits for the driver before it goes on by itself."""


def pause(file: str) -> None:
    """Announce the pause point (``file.paused``) and wait for ``file.go``."""
    import time

    Path(f"{file}.paused").touch()
    deadline = time.monotonic() + PAUSE_LIMIT
    while not Path(f"{file}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    log.info("pause at %s over", file)


def pause_in_staging(file: str) -> None:
    """Pause once, inside the staging transaction, right after a state's COPY."""
    from airflow_txn_provider.state import MapState

    stage_arrow = MapState.stage_arrow
    done: list[bool] = []

    def stage_then_pause(self: MapState, *args: object, **kwargs: object) -> int:
        rows = stage_arrow(self, *args, **kwargs)  # type: ignore[arg-type]
        if not done:
            done.append(True)
            pause(file)
        return rows

    MapState.stage_arrow = stage_then_pause  # type: ignore[method-assign]


def split_jobs(transform: Transform) -> tuple[Transform, Transform]:
    """Two jobs of one txid: ``transform``'s rows of the words before ``m``, and the rest."""
    from pyspark.sql import functions as F

    def first(batch: DataFrame) -> DataFrame:
        counts = transform(batch)
        assert not isinstance(counts, Mapping)
        return counts.where(F.col("word") < "m")

    def rest(batch: DataFrame) -> DataFrame:
        counts = transform(batch)
        assert not isinstance(counts, Mapping)
        return counts.where(F.col("word") >= "m")

    return first, rest


def load_transform(path: Path = WORD_COUNT) -> Transform:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"chaos_job_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.transform  # type: ignore[no-any-return]


def to_state_and_sinks(transform: Transform, state: str, sinks: Sequence[str]) -> Transform:
    """``transform``'s one DataFrame for several outputs: the map state ``state`` and the lake
    sinks ``sinks`` (a pipeline with several outputs returns ``{output name: DataFrame}``)."""

    def every(batch: DataFrame) -> dict[str, DataFrame]:
        counts = transform(batch)
        assert not isinstance(counts, Mapping), "a transform of one output"
        return {state: counts, **{sink: counts for sink in sinks}}

    return every


def run_two_jobs(
    runner: SparkConnectRunner,
    job: BatchJob,
    txlog: TransactionLog,
    pause_between: str | None,
    holder: str | None = None,
) -> ProcessOutcome:
    """Process the attempt as two jobs (``runner``'s transform split by :func:`split_jobs`),
    then record its output, as a txid of two processing tasks does; ``pause_between``: the
    pause file to announce between the jobs."""
    import dataclasses

    from airflow_txn_provider.transactions.commit import record_processed

    part = dataclasses.replace(job, finish=False)
    first, rest = split_jobs(runner.transform)
    staged: dict[str, int] = {}
    for i, piece in enumerate((first, rest)):
        if i == 1 and pause_between is not None:
            pause(pause_between)
        runner.transform = piece
        outcome = runner.run(part, txlog, holder=holder)
        if outcome.status == "stale":
            return outcome
        for key, rows in outcome.staged_rows.items():
            staged[key] = staged.get(key, 0) + rows
    action = record_processed(txlog, job.pipeline, job.txid, job.attempt)
    status = "stale" if action == "ignore_stale" else "processed"
    return ProcessOutcome(job, status, staged)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--txid", required=True, type=int)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument("--source", required=True, help="JSON from SparkSource.to_spec()")
    parser.add_argument("--spark-url", required=True, help="sc://127.0.0.1:PORT")
    parser.add_argument("--lease", type=float, default=3.0, help="lease timeout, seconds")
    parser.add_argument("--outage-timeout", type=float, default=60.0)
    parser.add_argument(
        "--sink", dest="sinks", action="append", default=[], help="JSON of a LakeSink.to_spec()"
    )
    parser.add_argument("--state", default=None, help="with --sink: the map state's name")
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="jobs per txid")
    parser.add_argument("--pause-at", choices=PAUSE_POINTS, default=None)
    parser.add_argument("--pause-file", default=None)
    parser.add_argument("--job", default=None, help="a job file (default: the word count)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    url = os.environ.get(LOG_URL_ENV)
    if not url:
        print(f"error: ${LOG_URL_ENV} is not set", file=sys.stderr)
        return 2
    if args.pause_at and not args.pause_file:
        parser.error("--pause-at needs --pause-file")
    if args.pause_at == "between_jobs" and args.jobs != 2:
        parser.error("--pause-at between_jobs needs --jobs 2")
    # A job file's module is pickled by value (its UDFs reach the server's Python workers)
    transform = load_job_module(args.job).transform if args.job else load_transform()
    sinks: tuple[LakeSink, ...] = ()
    if args.sinks:
        if args.state is None:
            parser.error("--sink needs --state")
        if args.jobs != 1:
            parser.error("--sink needs --jobs 1 (a txid with lake sinks has one job)")
        sinks = tuple(sink_from_spec(spec) for spec in args.sinks)
        transform = to_state_and_sinks(transform, args.state, [s.name for s in sinks])
    if args.pause_at == "staging":
        pause_in_staging(args.pause_file)
    source = source_from_spec(args.source)
    job = BatchJob(args.pipeline, args.txid, args.attempt, source, sinks=sinks)
    txlog = TransactionLog.from_url(url, migrate=False, outage_timeout=args.outage_timeout)
    # The processing operator's own runner: a slot's server session, released on failure.
    runner = SparkConnectRunner(transform, url=args.spark_url, connect_timeout=30.0)
    holder = holder_name(f"chaos worker txid {job.txid} attempt {job.attempt}")
    keeper = LeaseKeeper(
        txlog,
        job.pipeline,
        job.txid,
        job.attempt,
        holder=holder,
        timeout=args.lease,
        on_lost=runner.kill,
    )

    def on_kill(signum: int, frame: object) -> None:  # the processing operator's on_kill
        keeper.abandon()
        runner.kill()

    signal.signal(signal.SIGTERM, on_kill)
    try:
        with keeper:
            if keeper.lost:  # failed before this process could take the lease over
                print(json.dumps({"status": "stale"}))
                return 0
            if args.jobs == 1:
                outcome = runner.run(job, txlog, holder=holder)
            else:
                between = args.pause_file if args.pause_at == "between_jobs" else None
                outcome = run_two_jobs(runner, job, txlog, between, holder)
    except TxnError as err:
        log.error("%s", err)
        if runner.stopped:
            print(json.dumps({"status": "stopped"}))
        return 1
    finally:
        txlog.engine.dispose()
    print(json.dumps({"status": outcome.status, "staged_rows": dict(outcome.staged_rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
