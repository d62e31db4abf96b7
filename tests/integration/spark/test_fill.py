"""A fill's chunk computed on Spark (spark/fill.py), on a real classic session and Postgres log:
each txid's rows from its own batch, only the filling outputs evaluated, a missing one named."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from airflow_txn_provider.rules.exceptions import FillError
from airflow_txn_provider.sources.catalog import with_log_catalog
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.fill import FILL_TXID, compute_chunk
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.fill import Committed
from tests.spark_data import lines_in_ranges, parquet_dataset, random_lines, word_counts

P = "fc"
COUNTS = MapState(P, "fc_counts", keys={"word": "text"})
LENGTHS = MapState(P, "fc_lengths", keys={"n": "bigint"})
ALL = {s.name: s for s in (COUNTS, LENGTHS)}


def words(batch):
    return batch.select(F.explode(F.split("line", " ")).alias("word"))


def counts_and_a_length_never_computed(batch):
    """The word counts, and lengths that fail if Spark ever evaluates them."""
    never = F.raise_error(F.lit("the lengths were evaluated")).cast("long")
    return {
        COUNTS.name: words(batch).groupBy("word").agg(F.count("*").alias("delta")),
        LENGTHS.name: batch.select(never.alias("n"), F.lit(1).cast("long").alias("delta")),
    }


@pytest.fixture
def committed(txlog, tmp_path):
    """Three txids of 10 lines begun (their batches recorded by the log): ``(data, source,
    chunk)``."""
    data = {"0": random_lines(61, 30)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 10)
    txlog.register_pipeline(P, source_kind="transactional", max_pending=4)
    chunk = []
    for _ in range(3):
        e = txlog.begin_next(P, source)
        assert e is not None and e.emitted
        chunk.append(Committed(e.txid, e.attempt, e.metadata))
    return data, with_log_catalog(source, txlog.engine), chunk


def compute(spark, source, chunk, transforms, states):
    return compute_chunk(
        spark,
        pipeline=P,
        source=source,
        transforms=transforms,
        chunk=chunk,
        all_states=ALL,
        all_sinks=(),
        states=states,
        sinks=(),
        log_url="",
    )


def test_each_txid_gets_the_rows_of_its_own_batch_and_only_the_filling_outputs_run(
    spark, committed
):
    data, source, chunk = committed
    results = compute(spark, source, chunk, [counts_and_a_length_never_computed], [COUNTS])
    assert set(results.states) == {1, 2, 3} and dict(results.sinks) == {}
    for one in chunk:
        [(state, table)] = results.states[one.txid].items()
        assert state == COUNTS and table.column_names == ["word", "delta"]
        assert FILL_TXID not in table.column_names
        got = {r["word"]: r["delta"] for r in table.to_pylist()}
        assert got == dict(word_counts(lines_in_ranges(data, one.metadata))), one.txid


def test_a_filling_output_no_transform_returns_is_a_fill_error_naming_it(spark, committed):
    _, source, chunk = committed

    def counts_only(batch):
        return {COUNTS.name: words(batch).groupBy("word").agg(F.count("*").alias("delta"))}

    with pytest.raises(
        FillError, match="no job's transform returned a result for 'fc_lengths'"
    ) as err:
        compute(spark, source, chunk, [counts_only], [COUNTS, LENGTHS])
    assert (err.value.pipeline, err.value.txid, err.value.output) == (P, 1, "fc_lengths")
