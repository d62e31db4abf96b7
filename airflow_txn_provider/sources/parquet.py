"""The partitioned Parquet source (transactional): a begin finds new offsets in new files'
footers (``parquet_discovery.py``); a job reads its batch's files only, with offset pushdown."""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from airflow_txn_provider.rules.sources import Metadata, TransactionalSource, next_offset_ranges
from airflow_txn_provider.sources.base import LOCATION, RECORD, SparkSource, local_path
from airflow_txn_provider.sources.catalog import MARGIN_NS, UsesCatalog
from airflow_txn_provider.sources.parquet_discovery import check_template, discover
from airflow_txn_provider.sources.parquet_read import Files, read_with_partition_column
from airflow_txn_provider.utils.lineage import path_dataset

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


PREFETCH_REUSE_S = 60.0  # a look is reused (under the lock, by the next prefetch) at most this old
FOOTER_PROOF_FILES = 64  # a batch of at most this many files may be proven whole by its footers
Ranges = Mapping[str, tuple[int, int]]  # partition value -> a batch's [start, end)


@dataclasses.dataclass(frozen=True)
class PartitionedParquetSource(UsesCatalog, TransactionalSource, SparkSource):
    """A Parquet dataset ``<path>/<partition_column>=<p>/*.parquet`` whose partitions' rows carry
    consecutive offsets, in files never rewritten once complete (``docs/sources.md``). A txid's
    metadata is ``{p: [start, end)}`` (``p`` the directory's value as a string), at most
    ``max_per_partition`` offsets each; a batch reading other than ``end - start`` records fails.

    :param path: dataset root (local path or any URI Spark reads; footers are read locally).
    :param max_per_partition: batch size cap per partition.
    :param partition_column: name of the partition column (directory ``<name>=<value>``).
    :param offset_column: name of the offset column.
    :param required_columns: columns that must not be null; a null is a malformed record.
    :param index_dir: ignored; accepted so that earlier DAG files and stored specs load.
    :param file_name_template: the name of the file starting at ``{offset}`` of ``{partition}``
        (``"part-{offset:010d}.parquet"``): a begin looks up the next names instead of listing.
    :param schema: the files' columns as Spark DDL, without the partition column: no footer is
        read before a batch. ``None``: a footer's schema.
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
        if self.schema is not None:  # the files' columns only: the source adds the partition's
            column = re.escape(self.partition_column)
            named = re.search(rf"(^|,)\s*(`{column}`|{column})\s", f"{self.schema} ", re.I)
            if not isinstance(self.schema, str) or not self.schema.strip() or named:
                raise ValueError(
                    f"schema {self.schema!r}: declare the files' columns as Spark DDL, without "
                    f"the partition column {self.partition_column!r} (the source adds it)"
                )

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
        """For each partition, one past its highest offset (new files' footers only)."""
        return {p: part.end for p, part in discover(self, self.partitions(), complete=True).items()}

    def prefetch(self) -> None:
        """The begin's look outside the lock, reused by :meth:`initialize_transaction` (same
        object) while no folder it looked at has changed. The next prefetch reuses it too while
        its folders had settled before it (a waker's idle polls ask nothing of the catalog)."""
        seen = self.__dict__.get("_last_look")
        if seen is None or not seen.holds(settled=True):
            looked_at, stamps = time.time_ns(), {self.path: _stamp(self.path)}
            roots = self.partitions()
            found = discover(self, roots, complete=True)
            for p, part in found.items():
                stamps |= {os.path.join(roots[p], rel): f[:2] for rel, f in part.folders.items()}
            latest = {p: part.end for p, part in found.items()}
            named, nexts = self.file_name_template, []
            if named:
                nexts = [
                    os.path.join(roots[p], named.format(offset=e, partition=p))
                    for p, e in latest.items()
                ]
            seen = _Seen(time.monotonic(), looked_at, stamps, latest, nexts)
            object.__setattr__(self, "_last_look", seen)
        object.__setattr__(self, "_prefetched", seen)

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        prefetched = self.__dict__.pop("_prefetched", None)  # used once
        reused = prefetched is not None and prefetched.holds()
        latest = prefetched.latest if reused else self.latest_offsets()
        return next_offset_ranges(
            prev_metadata, latest, max_per_partition=self.max_per_partition, txid=txid
        )

    # Spark side ---------------------------------------------------------------------------------

    def lineage_dataset(self) -> tuple[str, str]:
        return path_dataset(self.path)

    def _ranges(self, metadata: Metadata) -> dict[str, tuple[int, int]]:
        """The partitions with records, in order: ``p -> (start, end)``."""
        ranges = {str(p): (int(r[0]), int(r[1])) for p, r in dict(metadata).items() if r[1] > r[0]}
        return dict(sorted(ranges.items()))

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        ranges = self._ranges(metadata)
        if not ranges:
            raise ValueError(f"metadata {metadata!r} names no records")
        base = self.path.rstrip("/")
        files, inside = self._batch_files(base, ranges)
        proven = inside and _rows_match(files, ranges)  # then no counts (batch_counts)
        object.__setattr__(self, "_proven", ranges if proven else None)
        # One scan where Spark reads each directory's value back exactly (faster: make bench-read)
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

    def _read_by_partition(self, spark: SparkSession, files: Files, ranges: Ranges) -> DataFrame:
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

    def _batch_files(self, base: str, ranges: Ranges) -> tuple[dict[str, list[str]], bool]:
        """Per partition, the files whose offsets meet its range (its folder when it cannot be
        looked at here or none does), and whether each lies wholly inside its range."""
        folders = {p: f"{base}/{self.partition_column}={p}" for p in sorted(ranges)}
        key = self.catalog_key()
        try:  # as a begin looks: a file landed since with this batch's offsets is read, counted
            for by_name in (True, False):  # files gone: a listing, not a look-up
                discover(self, folders, by_name=by_name)
                found = {p: self.catalog.meeting(key, p, *ranges[p]) for p in folders}
                if all(os.path.exists(f"{folders[p]}/{n}") for p in found for n in found[p]):
                    break
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
        if self.__dict__.get("_proven") == self._ranges(metadata):
            return None
        from pyspark.sql import functions as F

        part = F.col(self.partition_column)
        return {f"n_{i}": F.count_if(part == p) for i, p in enumerate(self._ranges(metadata))}

    def counts_mismatch(self, counts: Mapping[str, Any], metadata: Metadata) -> str | None:
        """Offsets are consecutive: ``[start, end)`` is ``end - start`` records, no fewer (files
        gone) nor more (offsets written twice)."""
        problems = [
            f"partition {p!r} offsets [{a}, {b}): {n} records read, {b - a} expected"
            for i, (p, (a, b)) in enumerate(self._ranges(metadata).items())
            if (n := int(counts.get(f"n_{i}") or 0)) != b - a
        ]
        return "; ".join(problems) or None

    def malformed_records(self, batch: DataFrame) -> DataFrame | None:
        if not self.required_columns:
            return None
        from pyspark.sql import functions as F

        missing = functools.reduce(operator.or_, [F.col(c).isNull() for c in self.required_columns])
        offset = F.col(self.offset_column)
        located = F.concat(F.col(LOCATION), F.lit(f" {self.offset_column}="), offset)
        record = F.to_json(F.struct(*[F.col(c) for c in batch.columns if c != LOCATION]))
        return batch.where(missing).select(located.alias(LOCATION), record.alias(RECORD))

    def describe_location(self, location: str, record: str) -> str:
        return local_path(location)


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


class _Seen(NamedTuple):
    """A look's answer (``latest``) and what tells whether it still holds."""

    at: float  # time.monotonic() when it was made
    looked_at: int  # ns of the clock when it was made
    stamps: Mapping[str, tuple[int, int]]  # each folder it saw: (inode, mtime_ns)
    latest: dict[str, int]
    nexts: list[str]  # the files named for the partitions' next offsets (file_name_template)

    def holds(self, *, settled: bool = False) -> bool:
        """Whether it is recent and no folder it saw changed since; ``settled``: nor in the
        ``MARGIN_NS`` before it (a change may hide in the same timestamp tick), and no file named
        for a next offset is there (one still being written when it looked changes no folder)."""
        if settled and (
            any(mtime_ns >= self.looked_at - MARGIN_NS for _, mtime_ns in self.stamps.values())
            or any(map(os.path.exists, self.nexts))
        ):
            return False
        try:
            recent = time.monotonic() - self.at <= PREFETCH_REUSE_S
            return recent and all(_stamp(path) == stamp for path, stamp in self.stamps.items())
        except OSError:
            return False


def _rows_match(files: Files, ranges: Ranges) -> bool:
    """Whether each partition's files hold exactly ``end - start`` rows by their few footers."""
    import pyarrow.parquet as pq

    try:
        return sum(map(len, files.values())) <= FOOTER_PROOF_FILES and all(
            sum(pq.read_metadata(local_path(f)).num_rows for f in files[p]) == b - a
            for p, (a, b) in ranges.items()
        )
    except (OSError, ValueError):
        return False
