"""The partitioned Parquet source: a dataset with an increasing offset column (transactional).

The Airflow side finds new offsets in Parquet footers (``sources/parquet_discovery.py``); the
Spark side reads a batch's files only, with offset pushdown, never scanning the dataset.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from airflow_txn_provider.rules.sources import Metadata, TransactionalSource, next_offset_ranges
from airflow_txn_provider.sources.base import LOCATION, RECORD, SparkSource, local_path
from airflow_txn_provider.sources.catalog import UsesCatalog
from airflow_txn_provider.sources.parquet_discovery import check_template, discover
from airflow_txn_provider.sources.parquet_read import read_with_partition_column
from airflow_txn_provider.utils.lineage import path_dataset

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


PREFETCH_REUSE_S = 60.0
"""The step under the lock reuses the begin's prefetch at most this old."""
FOOTER_PROOF_FILES = 64
"""A batch of at most this many files is proven whole by their footers' row counts (a footer read
each, in the job's process); a larger one is counted while Spark reads it."""
_footers_prove: dict[str, bool] = {}
"""Batches read in this process -> whether their footers proved them whole (batch_counts)."""


@dataclasses.dataclass(frozen=True)
class PartitionedParquetSource(UsesCatalog, TransactionalSource, SparkSource):
    """A Parquet dataset ``<path>/<partition_column>=<p>/*.parquet`` with an increasing offset.

    Each partition's rows carry consecutive offsets, as in a Kafka partition. A txid takes at
    most ``max_per_partition`` new offsets of every partition; its metadata is ``{p: [start,
    end)}``, and a batch that reads other than ``end - start`` records of ``p`` fails its txid
    (:class:`~airflow_txn_provider.rules.exceptions.IncompleteBatchError`). Data is appended as
    new files of higher offsets; a complete file is never rewritten (it may be deleted), so a
    txid's batch is the same on every replay (``docs/sources.md``). The partition column is the
    directory's value as a string, exactly (``p=01`` is ``"01"``).

    :param path: dataset root (local path or any URI Spark reads; footers are read locally).
    :param max_per_partition: batch size cap per partition.
    :param partition_column: name of the partition column (directory ``<name>=<value>``).
    :param offset_column: name of the offset column.
    :param required_columns: columns that must not be null; a null is a malformed record.
    :param index_dir: ignored (discovery keeps what it finds in the log's Postgres:
        :mod:`~airflow_txn_provider.sources.catalog`); accepted so that DAG files and stored
        specs of earlier versions load.
    :param file_name_template: when every file is named by its first offset (Kafka Connect's
        convention), the name of the file holding offset ``{offset}`` of partition
        ``{partition}``, e.g. ``"part-{offset:010d}.parquet"``: a begin then looks up the next
        names instead of listing a changed partition folder (``docs/sources.md``).
    :param schema: the files' columns as a Spark DDL string, without the partition column
        (``"offset BIGINT, line STRING"``), as Structured Streaming's file source asks for: a
        batch is then read without a footer read first. ``None``: the schema of a footer.
    """

    path: str
    max_per_partition: int = 100_000
    partition_column: str = "p"
    offset_column: str = "offset"
    required_columns: tuple[str, ...] = ()
    index_dir: str | None = None
    file_name_template: str | None = None
    schema: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "required_columns", tuple(self.required_columns))
        if self.max_per_partition < 1:
            raise ValueError(f"max_per_partition must be >= 1, got {self.max_per_partition}")
        if self.file_name_template is not None:
            check_template(self.file_name_template)
        if self.schema is not None:
            _check_schema(self.schema, self.partition_column)

    # Airflow side -------------------------------------------------------------------------------

    def partitions(self) -> dict[str, Path]:
        """Partition value -> directory, for the partitions present now."""
        prefix = f"{self.partition_column}="
        try:
            with os.scandir(self.path) as it:
                entries = [e for e in it if e.name.startswith(prefix) and e.is_dir()]
        except OSError as err:
            raise OSError(f"Parquet dataset {self.path} cannot be listed: {err}") from err
        return {unquote(e.name[len(prefix) :]): Path(e.path) for e in entries}

    def catalog_key(self) -> str:
        where = self.path if "://" in self.path else os.path.abspath(self.path)
        return f"parquet:{where}:{self.partition_column}:{self.offset_column}"

    def latest_offsets(self) -> dict[str, int]:
        """For each partition, one past its highest offset, from the footers of new files only
        (``sources/parquet_discovery.py``)."""
        return {p: part.end for p, part in discover(self, self.partitions(), complete=True).items()}

    def prefetch(self) -> None:
        """The begin's look at the dataset, outside the lock: :meth:`initialize_transaction` (on
        the same object) reuses its answer while no folder it looked at changed since."""
        object.__setattr__(self, "_prefetched", None)
        stamps = {self.path: _stamp(self.path)}
        roots = self.partitions()
        found = discover(self, roots, complete=True)
        for p, part in found.items():
            stamps |= {os.path.join(roots[p], rel): f[:2] for rel, f in part.folders.items()}
        latest = {p: part.end for p, part in found.items()}
        object.__setattr__(self, "_prefetched", (time.monotonic(), stamps, latest))

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        prefetched = self.__dict__.pop("_prefetched", None)  # used once
        if prefetched is not None and _unchanged(*prefetched[:2]):
            latest = prefetched[2]
        else:
            latest = self.latest_offsets()
        return next_offset_ranges(
            prev_metadata, latest, max_per_partition=self.max_per_partition, txid=txid
        )

    # Spark side ---------------------------------------------------------------------------------

    def lineage_dataset(self) -> tuple[str, str]:
        return path_dataset(self.path)

    def _ranges(self, metadata: Metadata) -> dict[str, tuple[int, int]]:
        return {str(p): (int(r[0]), int(r[1])) for p, r in dict(metadata).items() if r[1] > r[0]}

    def _proof_key(self, metadata: Metadata) -> str:
        where = f"{self.path}|{self.partition_column}|{self.offset_column}"
        return f"{where}|{json.dumps(metadata, sort_keys=True, default=str)}"

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        ranges = self._ranges(metadata)
        if not ranges:
            raise ValueError(f"metadata {metadata!r} names no records")
        base = self.path.rstrip("/")
        files, inside = self._batch_files(base, ranges)
        # Files wholly inside their ranges hold no row to filter out; if their footers' row
        # counts add up to each range too, the batch is whole without a count.
        if len(_footers_prove) >= 64:
            _footers_prove.clear()
        _footers_prove[self._proof_key(metadata)] = inside and _rows_match(files, ranges)
        # One scan of the batch's files (a scan per partition, unioned, took 1.4x as long: make
        # bench-read), each row's partition value from its directory, where Spark reads it back
        # exactly as the metadata names it; else a scan per partition.
        scan = read_with_partition_column(spark, base, self.partition_column, files, self.schema)
        if scan is None:
            return self._read_by_partition(spark, files, ranges)
        if not inside:  # the offset filter goes down to the Parquet reader (row groups skipped)
            offset, part = F.col(self.offset_column), F.col(self.partition_column)
            low, high = min(a for a, _ in ranges.values()), max(b for _, b in ranges.values())
            within = (offset >= low) & (offset < high)
            if len(set(ranges.values())) > 1:  # partitions at different offsets: each its own
                each = [(part == p) & (offset >= a) & (offset < b) for p, (a, b) in ranges.items()]
                within &= functools.reduce(operator.or_, each)
            scan = scan.where(within)
        return scan.select("*", *self._located())

    def _located(self) -> list[Column]:
        """The file of each row, for :meth:`malformed_records` (when a column is required)."""
        from pyspark.sql import functions as F

        return [F.col("_metadata.file_path").alias(LOCATION)] if self.required_columns else []

    def _read_by_partition(
        self,
        spark: SparkSession,
        files: Mapping[str, list[str]],
        ranges: Mapping[str, tuple[int, int]],
    ) -> DataFrame:
        """A scan per partition, labelled by the metadata's partition value, unioned."""
        from pyspark.sql import functions as F

        offset = F.col(self.offset_column)
        frames = [
            spark.read.parquet(*files[p])
            .where((offset >= a) & (offset < b))
            .select("*", F.lit(p).alias(self.partition_column), *self._located())
            for p, (a, b) in sorted(ranges.items())
        ]
        return functools.reduce(lambda x, y: x.unionByName(y, allowMissingColumns=True), frames)

    def _files_holding(self, base: str, partition: str, start: int, end: int) -> list[str]:
        """The paths :meth:`_batch_files` finds for one partition."""
        return self._batch_files(base, {partition: (start, end)})[0][partition]

    def _batch_files(
        self, base: str, ranges: Mapping[str, tuple[int, int]]
    ) -> tuple[dict[str, list[str]], bool]:
        """Per partition, the files whose offsets meet its ``[start, end)`` (a batch opens its own
        files only), and whether every one lies wholly inside its range. The partition's folder
        instead when its files cannot be listed here or none meets the range."""
        folders = {p: f"{base}/{self.partition_column}={p}" for p in sorted(ranges)}
        key = self.catalog_key()
        try:
            # Looked at as a begin looks (a folder unchanged since a listing: one stat), so a
            # file landed since with offsets of this batch (written twice) is read and counted.
            discover(self, folders)
            found = {p: self.catalog.meeting(key, p, *ranges[p]) for p in folders}
            if not all(os.path.exists(f"{folders[p]}/{n}") for p in found for n in found[p]):
                discover(self, folders, by_name=False)  # files gone: a listing, not a look-up
                found = {p: self.catalog.meeting(key, p, *ranges[p]) for p in folders}
        except OSError:
            return {p: [folder] for p, folder in folders.items()}, False
        files = {
            p: [f"{folder}/{n}" for n in sorted(found[p], key=lambda n: n.split("/"))] or [folder]
            for p, folder in folders.items()
        }
        inside = all(found.values()) and all(
            ranges[p][0] <= a and b < ranges[p][1] for p in found for a, b in found[p].values()
        )
        return files, inside

    def records(self, batch: DataFrame) -> DataFrame:
        return batch.drop(LOCATION)

    def batch_counts(self, metadata: Metadata) -> dict[str, Column] | None:
        """The records read of each partition (``n_0``, ``n_1``, … in partition order); ``None``
        when the batch's read found them in its files' footers already."""
        if _footers_prove.get(self._proof_key(metadata)):
            return None
        from pyspark.sql import functions as F

        part = F.col(self.partition_column)
        return {
            f"n_{i}": F.sum(F.when(part == F.lit(p), 1).otherwise(0))
            for i, p in enumerate(sorted(self._ranges(metadata)))
        }

    def counts_mismatch(self, counts: Mapping[str, Any], metadata: Metadata) -> str | None:
        """Offsets are consecutive, so ``[start, end)`` is ``end - start`` records: fewer (files
        gone) or more (offsets written twice) is reported, never committed."""
        ranges = self._ranges(metadata)
        found = {p: int(counts.get(f"n_{i}") or 0) for i, p in enumerate(sorted(ranges))}
        problems = [
            f"partition {p!r} offsets [{a}, {b}): {found[p]} records read, {b - a} expected"
            for p, (a, b) in sorted(ranges.items())
            if found[p] != b - a
        ]
        return "; ".join(problems) or None

    def malformed_records(self, batch: DataFrame) -> DataFrame | None:
        if not self.required_columns:
            return None
        from pyspark.sql import functions as F

        missing = functools.reduce(operator.or_, [F.col(c).isNull() for c in self.required_columns])
        columns = [F.col(c) for c in batch.columns if c != LOCATION]
        return batch.where(missing).select(
            F.concat(
                F.col(LOCATION), F.lit(f" {self.offset_column}="), F.col(self.offset_column)
            ).alias(LOCATION),
            F.to_json(F.struct(*columns)).alias(RECORD),
        )

    def describe_location(self, location: str, record: str) -> str:
        return local_path(location)


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def _unchanged(at: float, stamps: Mapping[str, tuple[int, int]]) -> bool:
    """Whether a look made at ``at`` (monotonic) is recent and no folder it saw changed since."""
    try:
        recent = time.monotonic() - at <= PREFETCH_REUSE_S
        return recent and all(_stamp(path) == stamp for path, stamp in stamps.items())
    except OSError:
        return False


def _rows_match(files: Mapping[str, list[str]], ranges: Mapping[str, tuple[int, int]]) -> bool:
    """Whether each partition's files hold exactly ``end - start`` rows, by their footers;
    ``False`` when there are too many files to read footers of, or one cannot be read."""
    if sum(len(paths) for paths in files.values()) > FOOTER_PROOF_FILES:
        return False
    import pyarrow.parquet as pq

    try:
        return all(
            sum(pq.read_metadata(local_path(f)).num_rows for f in files[p]) == b - a
            for p, (a, b) in ranges.items()
        )
    except (OSError, ValueError):
        return False


def _check_schema(schema: str, partition_column: str) -> None:
    """A ValueError for a declared schema that is empty or names the partition column (its value
    is the directory's name, a string: the source adds it)."""
    if not isinstance(schema, str) or not schema.strip():
        raise ValueError(f"schema must be a Spark DDL string of the files' columns, got {schema!r}")
    column = re.escape(partition_column)
    if re.search(rf"(^|,)\s*(`{column}`|{column})\s", schema + " ", re.IGNORECASE):
        raise ValueError(
            f"schema {schema!r} names the partition column {partition_column!r}: declare the "
            "files' columns only (the source adds the partition column, as a string)"
        )
