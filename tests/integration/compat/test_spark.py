"""compat/spark.py on a real Spark: the Arrow collect the jobs stage from, alike on PySpark 3.5
(its Arrow batches) and 4.x (``DataFrame.toArrow``)."""

from __future__ import annotations


def test_to_arrow_keeps_the_schema_of_an_empty_frame(spark):
    from airflow_txn_provider.compat.spark import to_arrow

    frame = spark.createDataFrame([("a", 1), ("b", 2)], "word string, delta long")
    assert to_arrow(frame).to_pylist() == [{"word": "a", "delta": 1}, {"word": "b", "delta": 2}]
    empty = to_arrow(frame.limit(0))
    assert empty.num_rows == 0 and empty.schema.names == ["word", "delta"]
