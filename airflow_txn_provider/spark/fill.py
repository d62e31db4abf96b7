"""The Spark side of a fill from history: one chunk of committed txids, computed for the filling
outputs only; :func:`fill_pipeline` gives it to the fill's loop
(:mod:`airflow_txn_provider.transactions.fill`), which applies what it returns.

Each txid's batch is read from the metadata the log recorded for it and given to the job's own
``transform``, exactly as its live processing was: the results of one txid never mix with
another's. For the states, the chunk's per-txid results are tagged with their txid and collected
in one Spark job (one plan over the chunk's batches, one Arrow collect), then split by txid;
the other outputs' DataFrames are never evaluated (Spark is lazy: only what is collected runs).
Each lake sink's rows are written per txid, as its live processing writes them (a directory of
the txid, recorded with its commit).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.spark import to_arrow
from airflow_txn_provider.rules.exceptions import FillError
from airflow_txn_provider.rules.filling import FILL_CHUNK
from airflow_txn_provider.sinks.base import LakeSink, StagedFiles
from airflow_txn_provider.sinks.staging import stage_frame
from airflow_txn_provider.sources.base import SparkSource
from airflow_txn_provider.sources.catalog import with_log_catalog
from airflow_txn_provider.spark.audit import JobAudit, input_kept
from airflow_txn_provider.spark.job import BatchJob, Transform, results_by_output
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.fill import (
    ChunkResults,
    Committed,
    FillReport,
    fill_outputs,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from airflow_txn_provider.rules.expectations import Expectation
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

FILL_TXID = "__txn_fill_txid"
"""The column that keeps a chunk's txids apart in its one collect (dropped before staging)."""


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
    expectations: Sequence[Expectation] = (),
) -> FillReport:
    """Fill every output of ``pipeline`` that fills from history until each has joined the live
    commits (or was taken over by another fill): :func:`~airflow_txn_provider.transactions.fill.
    fill_outputs`, its chunks computed here. ``spark``: a session, or a factory called once the
    first txid needs computing (a fill that applies staged rows only needs none);
    ``transforms``: the pipeline's jobs' (each computes some of its outputs); ``on_progress`` is
    called with a line per step (the task log's); ``expectations`` audit each filled txid."""
    session: list[SparkSession] = []
    log_url = txlog.engine.url.render_as_string(hide_password=False)
    source = with_log_catalog(source, txlog.engine)  # its files' offsets, as the begins found

    def compute(
        txids: Sequence[Committed],
        all_states: Mapping[str, MapState],
        states: Sequence[MapState],
        filling: Sequence[LakeSink],
    ) -> ChunkResults:
        if not session:
            session.append(spark() if callable(spark) else spark)
        return compute_chunk(
            session[0],
            pipeline=pipeline,
            source=source,
            transforms=transforms,
            chunk=txids,
            all_states=all_states,
            all_sinks=sinks,
            states=states,
            sinks=filling,
            log_url=log_url,
            expectations=expectations,
        )

    return fill_outputs(
        txlog,
        pipeline,
        compute=compute,
        sinks=sinks,
        chunk=chunk,
        wait=wait,
        on_progress=on_progress,
        stopped=stopped,
        expectations=expectations,
    )


def compute_chunk(
    spark: SparkSession,
    *,
    pipeline: str,
    source: SparkSource,
    transforms: Sequence[Transform],
    chunk: Sequence[Committed],
    all_states: Mapping[str, MapState],
    all_sinks: Sequence[LakeSink],
    states: Sequence[MapState],
    sinks: Sequence[LakeSink],
    log_url: str,
    expectations: Sequence[Expectation] = (),
) -> ChunkResults:
    """Compute ``states`` and ``sinks`` (filling outputs) for every txid of ``chunk`` with the
    pipeline's jobs' ``transforms`` (each returns some outputs); ``all_states`` and ``all_sinks``
    are the pipeline's, which the results are named after; the input's ``drop`` ``expectations``
    are applied as its live processing did, the filling sinks' measured (their drops taken out)
    for the fill to judge. Raises :class:`FillError` when no transform returns
    one of them."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    frames: dict[MapState, list[DataFrame]] = {state: [] for state in states}
    staged: dict[int, dict[LakeSink, StagedFiles]] = {}
    measured: dict[int, dict[str, Any]] = {}
    dropped: dict[int, dict[str, pa.Table]] = {}
    for one in chunk:
        job = BatchJob(pipeline, one.txid, one.attempt, source, sinks=tuple(all_sinks))
        batch = source.read_batch(spark, one.metadata)
        by_state: dict[MapState, DataFrame] = {}
        by_sink: dict[LakeSink, DataFrame] = {}
        for transform in transforms:  # lazy: only the filling outputs' frames are evaluated
            records = input_kept(expectations, source.records(batch))
            states_of, sinks_of = results_by_output(transform(records), all_states, job)
            by_state.update(states_of)
            by_sink.update(sinks_of)
        for state in states:
            if state not in by_state:
                raise _not_computed(pipeline, one, state.name)
            keys = [*state.keys, "delta"]
            frames[state].append(
                by_state[state].select(*keys).withColumn(FILL_TXID, F.lit(one.txid).cast("long"))
            )
        audited = JobAudit([e for e in expectations if e.on in {s.name for s in sinks}])
        for sink in sinks:
            if sink not in by_sink:
                raise _not_computed(pipeline, one, sink.name)
            staged.setdefault(one.txid, {})[sink] = stage_frame(
                spark,
                audited.sink(sink, by_sink[sink]),  # measured, its drops taken out
                sink,
                pipeline=pipeline,
                txid=one.txid,
                attempt=one.attempt,
                log_url=log_url,
            )
        measured[one.txid], dropped[one.txid] = audited.measured, audited.dropped_rows()
    tables: dict[int, dict[MapState, pa.Table]] = {one.txid: {} for one in chunk}
    for state, parts in frames.items():
        if not parts:
            continue
        collected = to_arrow(reduce(lambda a, b: a.unionByName(b), parts))
        for one in chunk:
            rows = collected.filter(pc.equal(collected[FILL_TXID], one.txid))
            tables[one.txid][state] = rows.drop_columns([FILL_TXID])
    return ChunkResults(tables, staged, measured, dropped)


def _not_computed(pipeline: str, one: Committed, output: str) -> FillError:
    return FillError(
        f"no job's transform returned a result for {output!r}, which fills from history: "
        "return {output name: DataFrame} with every output the pipeline declares",
        pipeline=pipeline,
        txid=one.txid,
        attempt=one.attempt,
        output=output,
    )


__all__ = ["FILL_TXID", "ChunkResults", "Committed", "compute_chunk"]
