"""The partitioned Parquet source: a dataset with an increasing offset column (transactional).

A txid's metadata is ``{p: [start, end)}``, one offset range per partition. The Airflow side finds
new offsets from Parquet footers (``sources/parquet_discovery.py``, kept in the log's catalog);
the Spark side reads a batch's files only, with offset pushdown, never scanning the dataset.
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
from airflow_txn_provider.sources.parquet_discovery import OffsetNames, discover
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
"""Batches (source path and metadata) read in this process, and whether their files' footers
proved them whole, for :meth:`batch_counts` (a job reads one batch: a few entries at most)."""


def _rows_match(files: Mapping[str, list[str]], ranges: Mapping[str, tuple[int, int]]) -> bool:
    """Whether each partition's files hold exactly its range's ``end - start`` rows, by their
    footers; ``False`` when there are too many files to read footers of, or one cannot be read."""
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


@dataclasses.dataclass(frozen=True)
class PartitionedParquetSource(UsesCatalog, TransactionalSource, SparkSource):
    """A Parquet dataset ``<path>/<partition_column>=<p>/*.parquet`` with an increasing offset.

    Each partition's rows carry consecutive offsets: every appended row takes the next one (as in
    a Kafka partition). A txid takes at most ``max_per_partition`` new offsets of every partition;
    its metadata is ``{p: [start, end)}``, so its batch holds ``end - start`` records of ``p``; a
    batch that reads another number fails its txid
    (:class:`~airflow_txn_provider.rules.exceptions.IncompleteBatchError`). Appends must only add
    offsets above the existing ones, as new files: a file is immutable once complete (it may be
    deleted; rewriting one in place is not supported, ``docs/sources.md``), so the batch of a
    txid is the same on every replay. The
    partition column is the directory's value as a string, exactly (``p=01`` is ``"01"``).

    New offsets are found from Parquet footers (the column's max statistic), not by reading data.

    :param path: dataset root (local path or any URI Spark reads; footers are read locally).
    :param max_per_partition: batch size cap per partition.
    :param partition_column: name of the partition column (directory ``<name>=<value>``).
    :param offset_column: name of the offset column.
    :param required_columns: columns that must not be null; a null is a malformed record.
    :param index_dir: ignored (what discovery finds is kept in the log's Postgres, shared by
        every host: :mod:`~airflow_txn_provider.sources.catalog`); accepted so that DAG files
        and stored specs of earlier versions load.
    :param file_name_template: when every file is named by its first offset (Kafka Connect's
        convention), the name of the file holding offset ``{offset}`` of partition
        ``{partition}``, e.g. ``"part-{offset:010d}.parquet"``: a begin then looks up the next
        names instead of listing a changed partition folder (``docs/sources.md``).
    :param schema: the files' columns as a Spark DDL string, without the partition column
        (``"offset BIGINT, line STRING"``), as Structured Streaming's file source asks for; a
        batch is then read without the schema round trip and footer read first.
        ``None``: the schema of a footer of each batch.
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
            OffsetNames(self.file_name_template)  # a ValueError that says what is wrong
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
        """For each partition, one past its highest offset, from footer statistics.

        Files are immutable once complete (new data is new files; a file may be deleted), so
        the catalog keeps each file's offset range and each folder's stamps at its last listing:
        an unchanged folder is not listed again; a changed one is listed by name, and only new
        names are looked at (``stat``, footer); with ``file_name_template``, the names after the
        partition's end are looked up instead of a listing (``sources/parquet_discovery.py``).
        The files holding the newest offsets are looked at on every call."""
        return self._latest(None)

    def _latest(self, stamps: dict[str, tuple[int, int]] | None) -> dict[str, int]:
        if stamps is not None:
            root = os.stat(self.path)
            stamps[self.path] = (root.st_ino, root.st_mtime_ns)
        roots = {p: str(d) for p, d in self.partitions().items()}
        key, names = self.catalog_key(), self._offset_names()
        found = discover(
            self.catalog,
            key,
            roots,
            column=self.offset_column,
            names=names,
            complete=True,
            stamps=stamps,
        )
        return {p: part.end for p, part in found.items()}

    def _offset_names(self) -> OffsetNames | None:
        template = self.file_name_template
        return OffsetNames(template) if template is not None else None

    def prefetch(self) -> None:
        """The begin's one pass over the dataset, outside the lock: the step under the lock
        (:meth:`initialize_transaction`, on the same object) reuses its answer while no folder
        it looked at has changed since (one ``stat`` per folder)."""
        stamps: dict[str, tuple[int, int]] = {}
        object.__setattr__(self, "_prefetched", None)
        latest = self._latest(stamps)
        object.__setattr__(self, "_prefetched", (time.monotonic(), stamps, latest))

    def _take_prefetched(self) -> dict[str, int] | None:
        """What :meth:`prefetch` found, if recent and no folder it looked at changed since."""
        entry = self.__dict__.pop("_prefetched", None)
        if entry is None or time.monotonic() - entry[0] > PREFETCH_REUSE_S:
            return None
        for path, stamp in entry[1].items():
            try:
                st = os.stat(path)
            except OSError:
                return None
            if (st.st_ino, st.st_mtime_ns) != stamp:
                return None
        return dict(entry[2])

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        latest = self._take_prefetched()
        if latest is None:
            latest = self.latest_offsets()
        return next_offset_ranges(
            prev_metadata,
            latest,
            max_per_partition=self.max_per_partition,
            txid=txid,
        )

    # Spark side ---------------------------------------------------------------------------------

    def _proof_key(self, metadata: Metadata) -> str:
        where = f"{self.path}|{self.partition_column}|{self.offset_column}"
        return f"{where}|{json.dumps(metadata, sort_keys=True, default=str)}"

    def _ranges(self, metadata: Metadata) -> dict[str, tuple[int, int]]:
        return {str(p): (int(r[0]), int(r[1])) for p, r in dict(metadata).items() if r[1] > r[0]}

    def lineage_dataset(self) -> tuple[str, str]:
        return path_dataset(self.path)

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        ranges = self._ranges(metadata)
        if not ranges:
            raise ValueError(f"metadata {metadata!r} names no records")
        base = self.path.rstrip("/")
        holding = self._batch_files(base, ranges)
        files = {p: paths for p, (paths, _) in holding.items()}
        # Every file wholly inside its partition's range (footer statistics): no row to filter
        # out, and the rows read are the files' rows: when their footers' row counts add up to
        # each range, the batch is whole with no count over its rows (batch_counts).
        whole = all(inside for _, inside in holding.values())
        if len(_footers_prove) >= 64:
            _footers_prove.clear()
        _footers_prove[self._proof_key(metadata)] = whole and _rows_match(files, ranges)
        # One scan of the batch's files (a scan per partition, unioned, took 1.4x as long: make
        # bench-read), each row with the metadata's partition value, as a string: from its
        # directory where Spark reads that back exactly, else looked up by the file it came from.
        scan = read_with_partition_column(spark, base, self.partition_column, files, self.schema)
        from_directory = scan is not None
        if scan is not None:
            label = F.col(self.partition_column)
        else:
            scan = spark.read.parquet(*[f for paths in files.values() for f in paths])
            by_file = self._label_by_file(scan, files)
            if by_file is None:
                return self._read_by_partition(spark, files, ranges)
            label = by_file
        offset = F.col(self.offset_column)
        # The offset filter goes down to the Parquet reader (row groups outside are skipped).
        low, high = min(a for a, _ in ranges.values()), max(b for _, b in ranges.values())
        within = (offset >= low) & (offset < high)
        if len(set(ranges.values())) > 1:  # partitions at different offsets: each its own range
            within = within & functools.reduce(
                operator.or_,
                [(label == p) & (offset >= a) & (offset < b) for p, (a, b) in ranges.items()],
            )
        located = [F.col("_metadata.file_path").alias(LOCATION)] if self.required_columns else []
        if not whole:
            scan = scan.where(within)
        if from_directory:  # the partition column is in place already
            return scan.select("*", *located)
        return scan.select("*", label.alias(self.partition_column), *located)

    def _label_by_file(self, scan: DataFrame, files: Mapping[str, list[str]]) -> Column | None:
        """The partition value of each row of ``scan``, looked up by its file's path as Spark
        names it (``_metadata.file_path``); ``None`` if a file Spark lists is not under exactly one
        of the batch's partitions (then each partition is read on its own)."""
        from pyspark.sql import functions as F

        owners = {path.rstrip("/"): p for p, paths in files.items() for path in paths}
        pairs: list[Column] = []
        for uri in scan.inputFiles():
            local = local_path(uri)
            found = {
                p
                for path, p in owners.items()
                for name in (uri, local)
                if name == path or name.startswith(path + "/")
            }
            if len(found) != 1:
                return None
            value = F.lit(found.pop())
            # inputFiles() names a local file file:///x, _metadata.file_path file:/x (the same
            # percent-encoding otherwise): the map holds both.
            for name in {uri, re.sub(r"^file:///", "file:/", uri)}:
                pairs += [F.lit(name), value]
        return F.create_map(*pairs)[F.col("_metadata.file_path")] if pairs else None

    def _read_by_partition(
        self,
        spark: SparkSession,
        files: Mapping[str, list[str]],
        ranges: Mapping[str, tuple[int, int]],
    ) -> DataFrame:
        """A scan per partition, labelled by the metadata's partition value, unioned."""
        from pyspark.sql import functions as F

        offset = F.col(self.offset_column)
        # The file of each row, for malformed_records (a union does not carry _metadata).
        located = [F.col("_metadata.file_path").alias(LOCATION)] if self.required_columns else []
        frames = [
            spark.read.parquet(*files[p])
            .where((offset >= a) & (offset < b))
            .select("*", F.lit(p).alias(self.partition_column), *located)
            for p, (a, b) in sorted(ranges.items())
        ]
        return functools.reduce(lambda x, y: x.unionByName(y, allowMissingColumns=True), frames)

    def _files_holding(self, base: str, partition: str, start: int, end: int) -> list[str]:
        """The paths :meth:`_batch_files` finds for one partition."""
        return self._batch_files(base, {partition: (start, end)})[partition][0]

    def _batch_files(
        self, base: str, ranges: Mapping[str, tuple[int, int]]
    ) -> dict[str, tuple[list[str], bool]]:
        """Per partition, the files whose offsets meet its ``[start, end)``, from their footers: a
        batch opens its own files only, however many earlier batches wrote (reading the whole
        directory, Spark opened every file to skip it by its statistics). The directory itself
        when its files cannot be listed here (a remote path) or none qualifies (the completeness
        check then reports what is missing). With them: whether every one lies wholly inside
        the range (then no row needs filtering out)."""
        folders = {p: f"{base}/{self.partition_column}={p}" for p in sorted(ranges)}
        key, column = self.catalog_key(), self.offset_column
        try:
            # Looked at as a begin looks (a folder unchanged since a listing: one stat), so a
            # file landed since with offsets of this batch (written twice) is read and counted.
            discover(self.catalog, key, folders, column=column, names=self._offset_names())
            found = {p: self.catalog.meeting(key, p, *ranges[p]) for p in folders}
            if not all(os.path.exists(f"{folders[p]}/{n}") for p in found for n in found[p]):
                # Files gone that a look-up of the next names does not see: a listing.
                discover(self.catalog, key, folders, column=column, names=None)
                found = {p: self.catalog.meeting(key, p, *ranges[p]) for p in folders}
        except OSError:
            return {p: ([folder], False) for p, folder in folders.items()}
        holding = {}
        for p, folder in folders.items():
            start, end = ranges[p]
            meeting = [
                (f"{folder}/{rel}", start <= low and high < end)
                for rel, (low, high) in sorted(found[p].items(), key=lambda kv: kv[0].split("/"))
                if low < end and high >= start
            ]
            holding[p] = (
                ([path for path, _ in meeting], all(inside for _, inside in meeting))
                if meeting
                else ([folder], False)
            )
        return holding

    def records(self, batch: DataFrame) -> DataFrame:
        return batch.drop(LOCATION)

    def batch_counts(self, metadata: Metadata) -> dict[str, Column] | None:
        """The records read of each partition of the batch (``n_0``, ``n_1``, … in partition
        order); ``None`` when its read found them in the files' footers already (every file
        read whole, their row counts adding up to each range)."""
        if _footers_prove.get(self._proof_key(metadata)):
            return None
        from pyspark.sql import functions as F

        part = F.col(self.partition_column)
        return {
            f"n_{i}": F.sum(F.when(part == F.lit(p), 1).otherwise(0))
            for i, p in enumerate(sorted(self._ranges(metadata)))
        }

    def counts_mismatch(self, counts: Mapping[str, Any], metadata: Metadata) -> str | None:
        """Offsets are consecutive (each appended row takes the next one), so ``[start, end)``
        of a partition is ``end - start`` records: fewer (a directory that does not match its
        metadata, files gone) or more (offsets written twice) is reported, never committed."""
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
                F.col(LOCATION),
                F.lit(f" {self.offset_column}="),
                F.col(self.offset_column),
            ).alias(LOCATION),
            F.to_json(F.struct(*columns)).alias(RECORD),
        )

    def describe_location(self, location: str, record: str) -> str:
        return local_path(location)


def _check_schema(schema: str, partition_column: str) -> None:
    """A ValueError for a declared schema that is empty or names the partition column (the
    partition's value is the directory's name, a string: the source adds it)."""
    if not isinstance(schema, str) or not schema.strip():
        raise ValueError(f"schema must be a Spark DDL string of the files' columns, got {schema!r}")
    column = re.escape(partition_column)
    if re.search(rf"(^|,)\s*(`{column}`|{column})\s", schema + " ", re.IGNORECASE):
        raise ValueError(
            f"schema {schema!r} names the partition column {partition_column!r}: declare the "
            "files' columns only (the source adds the partition column, as a string)"
        )
