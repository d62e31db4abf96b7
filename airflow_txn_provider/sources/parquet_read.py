"""One Spark scan of a Parquet batch's files, each row with its directory's name as its partition
value: a string, as the metadata names it (Spark would infer ``p=01`` as ``1``)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Files = Mapping[str, list[str]]  # partition value -> a batch's files (or its folder)


def read_with_partition_column(
    spark: SparkSession, base: str, partition_column: str, files: Files, schema: str | None = None
) -> DataFrame | None:
    """One scan of ``files`` under ``base``, ``partition_column`` holding each row's value;
    ``None`` when Spark would not read a value back exactly. ``schema``: the files' columns as
    Spark DDL (no footer read first); ``None``: read from a footer."""
    paths = [path for paths_of in files.values() for path in paths_of]
    exact = all(_reads_back(base, partition_column, v, f) for v, fs in files.items() for f in fs)
    if not paths or not exact:
        return None
    reader = spark.read.option("basePath", base)
    if schema is not None:  # no footer to read first, as Structured Streaming's file source
        quoted = partition_column.replace("`", "``")
        return reader.schema(f"{schema}, `{quoted}` STRING").parquet(*paths)
    from pyspark.sql.types import StringType

    data = spark.read.parquet(paths[0]).schema  # what a plain read infers, from one footer
    if partition_column in data.fieldNames():
        return None  # the files hold a column of that name: Spark would refuse the clash
    return reader.schema(data.add(partition_column, StringType())).parquet(*paths)


def _reads_back(base: str, partition_column: str, value: str, path: str) -> bool:
    """Whether Spark's partition discovery of ``path`` (``basePath`` ``base``) yields exactly
    ``partition_column`` = ``value`` and no other column: not for a name Spark would decode (a
    ``%`` escape, Hive's null partition, an empty value) nor a ``k=v`` folder below."""
    if not value or value == "__HIVE_DEFAULT_PARTITION__" or "%" in value or "/" in value:
        return False
    folder = f"{base}/{partition_column}={value}/"
    return path.startswith(folder) and "=" not in posixpath.dirname(path[len(folder) :])
