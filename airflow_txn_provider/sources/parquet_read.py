"""The Spark side of
:class:`~airflow_txn_provider.sources.parquet.PartitionedParquetSource`: one scan of a batch's
files, each row carrying the partition value of its directory.

The partition value is what the txid's metadata names, exactly, as a string. Spark's partition
discovery infers types (``p=01`` would read as ``1``, also ``p=1.50``, ``p=+5``), so the scan is
given its schema with the partition column as a string: then the value is the directory's name as
written, a constant Spark attaches per file (no work per row). That holds for a plain name; a name
Spark would decode differently than the source did (a ``%`` escape, Hive's null partition, an
empty value, a ``k=v`` folder under the partition's) is not read this way: the caller then labels
each row by the file it came from (a lookup per row).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def read_with_partition_column(
    spark: SparkSession,
    base: str,
    partition_column: str,
    files: Mapping[str, list[str]],
    schema: str | None = None,
) -> DataFrame | None:
    """One scan of ``files`` (partition value -> its files under ``base``) with the column
    ``partition_column`` holding each row's partition value as a string; ``None`` when a value
    or a path is one Spark would not read back as exactly that value (see the module's doc).
    ``schema``: the files' columns as a Spark DDL string, declared by the user; ``None``: read
    from a footer first (a round trip to the server and a footer read per batch)."""
    paths = [path for values in files.values() for path in values]
    if not paths or not all(
        _reads_back(base, partition_column, value, path)
        for value, paths_of in files.items()
        for path in paths_of
    ):
        return None
    if schema is not None:  # declared: no footer to read, as Structured Streaming's file source
        full = f"{schema}, {quote_identifier(partition_column)} STRING"
        return spark.read.schema(full).option("basePath", base).parquet(*paths)
    from pyspark.sql.types import StringType, StructField, StructType

    # The schema a plain read of these files infers (from one footer, as Spark does without
    # mergeSchema), plus the partition column as a string.
    data = spark.read.parquet(paths[0]).schema
    if partition_column in data.fieldNames():
        return None  # the files hold a column of that name: Spark would refuse the clash
    inferred = StructType([*data.fields, StructField(partition_column, StringType(), True)])
    return spark.read.schema(inferred).option("basePath", base).parquet(*paths)


def quote_identifier(name: str) -> str:
    """``name`` as a Spark SQL identifier in back-quotes (a back-quote in it doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _reads_back(base: str, partition_column: str, value: str, path: str) -> bool:
    """Whether Spark's partition discovery of ``path`` (with ``basePath`` = ``base``) yields
    exactly ``partition_column`` = ``value`` and no other partition column."""
    if not value or value == HIVE_NULL_PARTITION or "%" in value or "/" in value:
        return False
    folder = f"{base}/{partition_column}={value}/"
    if not path.startswith(folder):
        return False
    below = posixpath.dirname(path[len(folder) :])
    return not below or "=" not in below
