"""Pure transforms on a local SparkSession, the sources' reads, and job argument handling."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from airflow_txn_provider.operators.spark_runner import load_job_module
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.job import BatchJob, run_job
from tests.spark_data import (
    lines_in_ranges,
    parquet_dataset,
    random_lines,
    write_landing_file,
)

JOBS = Path(__file__).resolve().parents[3] / "spark_jobs"
word_count = load_job_module(JOBS / "word_count.py")
global_count = load_job_module(JOBS / "global_count.py")


def test_word_count_transform(spark):
    lines = spark.createDataFrame(
        [("The man and the dog",), ("dog's  DOG",), ("",), (None,)], "line string"
    )
    expected = spark.createDataFrame(
        [("the", 2), ("man", 1), ("and", 1), ("dog", 2), ("dog's", 1)], "word string, delta long"
    )
    assertDataFrameEqual(word_count.transform(lines), expected)


def test_global_count_transform(spark):
    lines = spark.createDataFrame([("a",), ("b",), (None,)], "line string")
    assertDataFrameEqual(global_count.transform(lines), [Row(delta=3)])
    empty = spark.createDataFrame([], "line string")
    assertDataFrameEqual(global_count.transform(empty), [Row(delta=0)])


def test_parquet_batch_reads_only_its_ranges_with_pushdown(spark, tmp_path):
    data = {"0": random_lines(1, 120), "1": random_lines(2, 80), "2": random_lines(3, 30)}
    source = PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 50)
    assert source.latest_offsets() == {"0": 120, "1": 80, "2": 30}
    first = source.initialize_transaction(1, None)
    assert first == {"0": [0, 50], "1": [0, 50], "2": [0, 30]}
    second = source.initialize_transaction(2, first)
    assert second == {"0": [50, 100], "1": [50, 80], "2": [30, 30]}

    batch = source.read_batch(spark, second)
    got = sorted(r.line for r in batch.select("line").collect())
    assert got == sorted(lines_in_ranges(data, second))
    plan = batch._jdf.queryExecution().executedPlan().toString()
    # One scan of the batch's files, no partition discovery; partition 2 has nothing new: its
    # directory is not even listed; offsets go to the reader.
    assert plan.count("InMemoryFileIndex(2 paths)") == 1 and "p=2" not in plan
    assert sorted(r.p for r in batch.select("p").distinct().collect()) == ["0", "1"]
    # Only the files holding the batch's offsets are opened (from their footers): not 0..49
    opened = sorted(f.split("/")[-2] + "/" + f.split("/")[-1] for f in batch.inputFiles())
    assert opened == ["p=0/part-00000050.parquet", "p=1/part-00000050.parquet"]
    # Both files lie wholly inside their ranges (footer statistics): no row is filtered out
    pushed = plan[plan.index("PushedFilters") :].split("]", 1)[0]
    assert "offset" not in pushed and "Filter" not in plan.split("FileScan")[0]

    # A range that starts inside a file: its offsets go to the reader, and only they are read
    third = {"0": [60, 100], "1": [50, 80]}
    batch = source.read_batch(spark, third)
    got = sorted(r.line for r in batch.select("line").collect())
    assert got == sorted(lines_in_ranges(data, third)) and len(got) == 70
    plan = batch._jdf.queryExecution().executedPlan().toString()
    pushed = plan[plan.index("PushedFilters") :].split("]", 1)[0]
    assert "GreaterThanOrEqual(offset" in pushed and "LessThan(offset" in pushed


def test_parquet_null_in_required_column_is_malformed(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "p=a").mkdir()
    pq.write_table(
        pa.table({"offset": [0, 1, 2], "line": ["x", None, "y"]}), tmp_path / "p=a" / "f.parquet"
    )
    source = PartitionedParquetSource(str(tmp_path), 10, required_columns=("line",))
    batch = source.read_batch(spark, {"a": [0, 3]})
    bad = source.malformed_records(batch).collect()
    assert len(bad) == 1
    assert "f.parquet offset=1" in source.describe_location(bad[0][0], bad[0][1])


def test_landing_source_skips_unavailable_partition_and_resumes(tmp_path):
    root = tmp_path / "landing"
    for seq in range(3):
        write_landing_file(root, "a", seq, ["x"])
        write_landing_file(root, "b", seq, ["y"])
    source = LandingDirectorySource(str(root), max_files_per_partition=2)
    first = source.initialize_transaction(1, None)
    assert first == {"a": [0, 2], "b": [0, 2]}
    (root / "b").rename(root / ".b-offline")
    assert source.initialize_transaction(2, first) == {"a": [2, 3], "b": [2, 2]}
    (root / ".b-offline").rename(root / "b")
    assert source.initialize_transaction(2, first) == {"a": [2, 3], "b": [2, 3]}


def test_landing_malformed_line_is_located(spark, tmp_path):
    root = tmp_path / "landing"
    path = write_landing_file(root, "a", 0, ["fine"])
    path.write_text(path.read_text() + "\n{not json\n")
    source = LandingDirectorySource(str(root))
    batch = source.read_batch(spark, {"a": [0, 1]})
    bad = source.malformed_records(batch).collect()
    assert [b[1] for b in bad] == ["{not json"]
    assert source.describe_location(bad[0][0], bad[0][1]) == f"{path}:3"
    assert [r.line for r in source.records(batch).collect()] == ["fine", None]


def test_batch_job_arguments_round_trip(tmp_path):
    job = BatchJob("words", 42, 3, LandingDirectorySource(str(tmp_path)), finish=False)
    assert BatchJob.from_args(job.to_args()) == job
    assert job.app_name == "txn:words:txid-000042:attempt-3"


def test_job_program_rejects_bad_input(tmp_path, capsys, monkeypatch):
    source = json.dumps(LandingDirectorySource(str(tmp_path)).to_spec())
    assert run_job(["--pipeline", "p", "--txid", "x"], word_count.transform) == 2
    assert "invalid int value" in capsys.readouterr().err
    args = ["--pipeline", "p", "--txid", "0", "--attempt", "1", "--source", source]
    assert run_job(args, word_count.transform) == 2
    assert "txid and attempt must be >= 1" in capsys.readouterr().err
    monkeypatch.delenv("TXN_LOG_URL", raising=False)
    args[3] = "1"
    assert run_job(args, word_count.transform) == 2
    assert "TXN_LOG_URL is not set" in capsys.readouterr().err
