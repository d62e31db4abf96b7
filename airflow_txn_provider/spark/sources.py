"""Sources that Spark reads: the two halves of Storm's transactional spout.

A :class:`SparkSource` is a :class:`~airflow_txn_provider.sources.Source` (it decides each txid's
metadata, on the Airflow side, without Spark) that can also *read* the batch its metadata describes
(on the Spark side, in the processing job). To write your own, subclass one of the two kinds and
implement three methods; ``docs/sources.md`` walks through one.

* :class:`PartitionedParquetSource` (transactional): a Parquet dataset partitioned by ``p`` with an
  increasing ``offset`` column. A txid's metadata is ``{p: [start, end)}``; the batch is read with
  partition pruning and offset pushdown, never by scanning the dataset.
* :class:`GeneratedTextSource` (transactional): lines of words generated at a steady rate from a
  hash of their position, so a replay is identical and no data set is needed (the examples).
* :class:`LandingDirectorySource` (opaque): a landing folder with one sub-folder per partition of
  numbered JSON-lines files (``<partition>/<seq>.jsonl``). A partition whose folder is missing or
  unreadable is skipped and continues later from where it stopped, so a replay may differ; the
  opaque state keeps results exact.

Sources are plain frozen dataclasses: :meth:`SparkSource.to_spec` turns one into JSON that a
``spark-submit`` command line carries, and :func:`source_from_spec` rebuilds it in the job.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
import os
import re
import stat
import time
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlparse

from airflow_txn_provider.sources import (
    Metadata,
    OpaqueSource,
    Source,
    TransactionalSource,
    next_offset_ranges,
)
from airflow_txn_provider.spark.file_index import (
    INDEX_MARGIN_NS,
    DiscoveryIndex,
    prefetched,
    take_prefetched,
)
from airflow_txn_provider.spark.parquet_discovery import OffsetNames, discover
from airflow_txn_provider.spark.parquet_index import ParquetPartition
from airflow_txn_provider.spark.parquet_read import read_with_partition_column
from airflow_txn_provider.specs import from_spec, to_spec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

LOCATION = "_txn_location"
"""Column of :meth:`SparkSource.malformed_records`: where the record is (file, line, offset)."""
RECORD = "_txn_record"
"""Column of :meth:`SparkSource.malformed_records`: the record as text."""


class SparkSource(Source):
    """A source whose batches a Spark job reads. Subclasses are frozen dataclasses."""

    @abstractmethod
    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        """The records of the batch that ``metadata`` describes, lazily (nothing runs yet).

        Read only what the metadata names (push the ranges down into the read). The frame may
        carry helper columns for :meth:`malformed_records`; :meth:`records` removes them.
        """

    def malformed_records(self, batch: DataFrame) -> DataFrame | None:
        """Rows of ``batch`` that cannot be processed, as columns ``LOCATION`` and ``RECORD``.

        ``None`` (the default) when the source cannot hold malformed records; the job then skips
        the check and its extra pass over the batch.
        """
        return None

    def records(self, batch: DataFrame) -> DataFrame:
        """``batch`` as the user's transform sees it (helper columns dropped)."""
        return batch

    def batch_counts(self, metadata: Metadata) -> dict[str, Column] | None:
        """Aggregates over the batch (``{name: column}``, e.g. the records of each partition) from
        which :meth:`counts_mismatch` tells whether the batch is whole; ``None`` (the default):
        the source cannot tell from its metadata how many records to expect.

        On Spark Connect the job computes them while the transform runs (``DataFrame.observe``),
        in the same pass over the batch; elsewhere in a pass of their own
        (:meth:`batch_mismatch`).
        """
        return None

    def counts_mismatch(self, counts: Mapping[str, Any], metadata: Metadata) -> str | None:
        """What the batch lacks against ``metadata``, judged from :meth:`batch_counts`' values,
        or ``None``."""
        return None

    def batch_mismatch(self, batch: DataFrame, metadata: Metadata) -> str | None:
        """What ``batch`` lacks against ``metadata`` (e.g. records a partition should hold), or
        ``None``. The job refuses a batch with a mismatch (:class:`~airflow_txn_provider.
        exceptions.IncompleteBatchError`) rather than commit it as if it were whole. By default,
        :meth:`batch_counts` in one pass of their own, judged by :meth:`counts_mismatch`."""
        counts = self.batch_counts(metadata)
        if not counts:
            return None
        row = batch.agg(*[column.alias(name) for name, column in counts.items()]).first()
        return self.counts_mismatch(row.asDict() if row is not None else {}, metadata)

    def describe_location(self, location: str, record: str) -> str:
        """Turn a ``LOCATION`` value into text a person can act on (e.g. add a line number)."""
        return location

    # -- passing a source to a Spark job ----------------------------------------------------------

    def to_spec(self) -> dict[str, Any]:
        """JSON-compatible description: ``{"class": "module:Name", "args": {...}}``."""
        return to_spec(self)


def source_from_spec(spec: Mapping[str, Any] | str) -> SparkSource:
    """Rebuild a source from :meth:`SparkSource.to_spec` output (a mapping or its JSON text)."""
    return cast(SparkSource, from_spec(spec, SparkSource, what="source"))


def _local_path(file_uri: str) -> str:
    parsed = urlparse(file_uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else file_uri


# -- transactional: a partitioned Parquet dataset with an offset column -------------------------


@dataclasses.dataclass(frozen=True)
class PartitionedParquetSource(TransactionalSource, SparkSource):
    """A Parquet dataset ``<path>/<partition_column>=<p>/*.parquet`` with an increasing offset.

    Each partition's rows carry consecutive offsets: every appended row takes the next one (as in
    a Kafka partition). A txid takes at most ``max_per_partition`` new offsets of every partition;
    its metadata is ``{p: [start, end)}``, so its batch holds ``end - start`` records of ``p``; a
    batch that reads another number fails its txid
    (:class:`~airflow_txn_provider.exceptions.IncompleteBatchError`). Appends must only add
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
    :param index_dir: folder of the discovery index (per partition: its highest offset, its
        folders as last listed, each file's offset range; so a begin in a new process lists only
        changed folders and reads only new files' footers); ``None``: a private folder under
        the system temp dir (:func:`default_index_dir`).
    :param file_name_template: when every file is named by its first offset (Kafka Connect's
        convention), the name of the file holding offset ``{offset}`` of partition
        ``{partition}``, e.g. ``"part-{offset:010d}.parquet"``: a begin then looks up the next
        names instead of listing a changed partition folder (``docs/sources.md``).
    """

    path: str
    max_per_partition: int = 100_000
    partition_column: str = "p"
    offset_column: str = "offset"
    required_columns: tuple[str, ...] = ()
    index_dir: str | None = None
    file_name_template: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "required_columns", tuple(self.required_columns))
        if self.max_per_partition < 1:
            raise ValueError(f"max_per_partition must be >= 1, got {self.max_per_partition}")
        if self.file_name_template is not None:
            OffsetNames(self.file_name_template)  # a ValueError that says what is wrong

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

    def latest_offsets(self) -> dict[str, int]:
        """For each partition, one past its highest offset, from footer statistics.

        Files are immutable once complete (new data is new files; a file may be deleted), so the
        discovery index (``index_dir``) keeps, per partition, its highest offset and each file's
        offset range: a partition folder unchanged since it was listed is not listed again; a
        changed one is listed by name, and only new names are looked at (``stat``, footer);
        with ``file_name_template``, the names after the partition's end are looked up instead
        of a listing (``spark/parquet_discovery.py``). The
        files holding the newest offsets are looked at on every call (a rewrite in place of one
        of them is seen; of an older file, not: ``docs/sources.md``)."""
        return self._latest(None)

    def _latest(self, stamps: dict[str, tuple[int, int]] | None) -> dict[str, int]:
        if stamps is not None:
            root = os.stat(self.path)
            stamps[self.path] = (root.st_ino, root.st_mtime_ns)
        found = self._discover(self.partitions(), complete=True, stamps=stamps)
        return {p: part.end for p, part in found.items()}

    def _discover(
        self,
        partitions: Mapping[str, Path],
        *,
        complete: bool,
        stamps: dict[str, tuple[int, int]] | None = None,
        table: bool = False,
    ) -> dict[str, ParquetPartition]:
        """Each partition's discovery state, brought up to date (and saved when it changed).
        ``complete``: ``partitions`` are all there are (the others' indexes are deleted);
        ``stamps``: filled with every folder looked at (``(inode, mtime_ns)``); ``table``: with
        each file's offset range loaded (the Spark side)."""
        template = self.file_name_template
        return discover(
            partitions,
            dataset=self.path,
            column=self.offset_column,
            index_dir=self.index_dir,
            names=OffsetNames(template) if template is not None else None,
            complete=complete,
            stamps=stamps,
            table=table,
        )

    def _prefetch_key(self) -> tuple[str, ...]:
        return (os.path.realpath(self.path), self.partition_column, self.offset_column)

    def prefetch(self) -> None:
        """The begin's one pass over the dataset, outside the lock: the step under the lock
        (:meth:`initialize_transaction`, in the same process) reuses its answer while no folder
        it looked at has changed since (one ``stat`` per folder)."""
        key = self._prefetch_key()
        prefetched.pop(key, None)
        stamps: dict[str, tuple[int, int]] = {}
        latest = self._latest(stamps)
        prefetched[key] = (time.monotonic(), stamps, latest)

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        latest = take_prefetched(self._prefetch_key())
        if latest is None:
            latest = self.latest_offsets()
        return next_offset_ranges(
            prev_metadata,
            latest,
            max_per_partition=self.max_per_partition,
            txid=txid,
        )

    # Spark side ---------------------------------------------------------------------------------

    def _ranges(self, metadata: Metadata) -> dict[str, tuple[int, int]]:
        return {str(p): (int(r[0]), int(r[1])) for p, r in dict(metadata).items() if r[1] > r[0]}

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        ranges = self._ranges(metadata)
        if not ranges:
            raise ValueError(f"metadata {metadata!r} names no records")
        base = self.path.rstrip("/")
        files = {p: self._files_holding(base, p, a, b) for p, (a, b) in sorted(ranges.items())}
        # One scan of the batch's files (a scan per partition, unioned, took 1.4x as long: make
        # bench-read), each row with the metadata's partition value, as a string: from its
        # directory where Spark reads that back exactly, else looked up by the file it came from.
        scan = read_with_partition_column(spark, base, self.partition_column, files)
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
        if from_directory:  # the partition column is in place already
            return scan.where(within).select("*", *located)
        return scan.where(within).select("*", label.alias(self.partition_column), *located)

    def _label_by_file(self, scan: DataFrame, files: Mapping[str, list[str]]) -> Column | None:
        """The partition value of each row of ``scan``, looked up by its file's path as Spark
        names it (``_metadata.file_path``); ``None`` if a file Spark lists is not under exactly one
        of the batch's partitions (then each partition is read on its own)."""
        from pyspark.sql import functions as F

        owners = {path.rstrip("/"): p for p, paths in files.items() for path in paths}
        pairs: list[Column] = []
        for uri in scan.inputFiles():
            local = _local_path(uri)
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
        """The files of ``partition`` whose offsets meet ``[start, end)``, from their footers: a
        batch opens its own files only, however many earlier batches wrote (reading the whole
        directory, Spark opened every file to skip it by its statistics). The directory itself
        when its files cannot be listed here (a remote path) or none qualifies (the completeness
        check then reports what is missing)."""
        directory = f"{base}/{self.partition_column}={partition}"
        try:
            found = self._discover({partition: Path(directory)}, complete=False, table=True)
            ranges = found[partition].ranges()
        except OSError:
            return [directory]
        files = [
            f"{directory}/{rel}"
            for rel, (low, high) in sorted(ranges.items(), key=lambda item: item[0].split("/"))
            if low < end and high >= start
        ]
        return files or [directory]

    def records(self, batch: DataFrame) -> DataFrame:
        return batch.drop(LOCATION)

    def batch_counts(self, metadata: Metadata) -> dict[str, Column] | None:
        """The records read of each partition of the batch (``n_0``, ``n_1``, … in partition
        order)."""
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
        return _local_path(location)


# -- opaque: a landing directory of numbered JSON-lines files -----------------------------------

_SEQ_FILE = re.compile(r"^(\d+)\.jsonl$")
_CORRUPT = "_corrupt_record"


@dataclasses.dataclass(frozen=True)
class LandingDirectorySource(OpaqueSource, SparkSource):
    """A landing folder ``<path>/<partition>/<seq>.jsonl`` of numbered JSON-lines files.

    Writers add files with increasing sequence numbers per partition, each written whole (write to
    a temporary name, then rename). Numbered consecutively (``0, 1, 2, …``), a begin looks up
    the next numbers instead of listing the partition (:meth:`latest_offsets_after`). A txid
    takes at most ``max_files_per_partition`` new files of every partition; its metadata is
    ``{partition: [first_seq, end_seq)}``.

    A partition folder that is missing or unreadable right now (an unmounted share, a producer
    offline) is left out of the batch and continues later from where it stopped. Replays can
    therefore differ, which makes this source opaque: pair it with opaque state.

    :param path: landing folder (local).
    :param schema: Spark DDL of a record, e.g. ``"line STRING"``. A line that is not a JSON
        object of this schema is a malformed record.
    :param max_files_per_partition: batch size cap per partition, in files.
    :param index_dir: folder of the discovery index (the newest file of each partition whose
        folder has not changed since it was listed); ``None``: a private folder under the
        system temp dir (:func:`default_index_dir`).
    """

    path: str
    schema: str = "line STRING"
    max_files_per_partition: int = 10
    index_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.max_files_per_partition < 1:
            raise ValueError(
                f"max_files_per_partition must be >= 1, got {self.max_files_per_partition}"
            )

    # Airflow side -------------------------------------------------------------------------------

    def files(self, partition: str) -> dict[int, Path]:
        """Sequence number -> file of one partition (``OSError`` if it is unavailable)."""
        directory = Path(self.path) / partition
        found = {}
        for entry in os.scandir(directory):
            match = _SEQ_FILE.match(entry.name)
            if match and entry.is_file():
                found[int(match.group(1))] = Path(entry.path)
        return found

    def latest_offsets(self) -> dict[str, int]:
        """For each available partition with files, one past its highest file number.

        An empty partition folder (every consumed file deleted) says nothing about where its
        numbering is: it is left out, and continues from where it stopped. A producer that then
        numbers from 0 again is caught (:class:`~airflow_txn_provider.exceptions.
        OffsetsWentBackError`) instead of its files being skipped.
        """
        latest = {}
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.startswith((".", "_")) or not entry.is_dir():
                continue
            try:
                seqs = self.files(entry.name)
            except OSError as err:
                log.warning("landing partition %s unavailable, skipped: %s", entry.path, err)
                continue
            if seqs:
                latest[entry.name] = max(seqs) + 1
        return latest

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        starts = {str(p): int(r[1]) for p, r in dict(prev_metadata or {}).items()}
        return next_offset_ranges(
            prev_metadata,
            self.latest_offsets_after(starts),
            max_per_partition=self.max_files_per_partition,
            txid=txid,
        )

    def latest_offsets_after(self, starts: Mapping[str, int]) -> dict[str, int]:
        """:meth:`latest_offsets` as far as the next batch needs it, without listing a
        partition that has new files: files are numbered consecutively, so from where the
        previous batch ended (``starts``, 0 for a partition it did not name) the files
        ``start``, ``start + 1``, … are looked up one by one, up to ``max_files_per_partition``
        (the batch takes no more). A partition without a file at its next number (no new file,
        a gap in the numbering, a renumbered producer, an empty folder) is listed, as
        :meth:`latest_offsets` does, unless its folder is unchanged since an earlier listing
        (the index says what that listing found). Missing or unreadable folders are skipped."""
        index = DiscoveryIndex(self.index_dir, "landing", self.path)
        entries = index.load()
        kept: dict[str, Any] = {}
        latest = {}
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.startswith((".", "_")) or not entry.is_dir():
                continue
            start = int(starts.get(entry.name, 0))
            try:
                found = self._probe(entry.path, start)
                if found:
                    latest[entry.name] = start + found
                    continue
                newest = self._newest(entry.name, entries.get(entry.name), kept)
            except OSError as err:
                log.warning("landing partition %s unavailable, skipped: %s", entry.path, err)
                continue
            if newest >= 0:
                latest[entry.name] = newest + 1
        if kept != entries:
            index.save(kept)
        return latest

    def _probe(self, folder: str, start: int) -> int:
        """How many files ``start``, ``start + 1``, … are there (at most the batch cap)."""
        with os.scandir(folder):
            pass  # the folder must be listable, as for a listing (the batch's read lists it)
        count = 0
        while count < self.max_files_per_partition:
            try:
                st = os.stat(os.path.join(folder, f"{start + count}.jsonl"))
            except FileNotFoundError:
                break
            if not stat.S_ISREG(st.st_mode):
                break
            count += 1
        return count

    def _newest(self, partition: str, known: Any, kept: dict[str, Any]) -> int:
        """The partition's highest file number (-1: none), from the index while its folder is
        unchanged since a listing that began well after the folder's last change, else listed."""
        folder_mtime = os.stat(os.path.join(self.path, partition)).st_mtime_ns
        if (
            type(known) is list
            and len(known) == 3
            and all(type(v) is int for v in known)
            and known[0] == folder_mtime
            and known[0] < known[1] - INDEX_MARGIN_NS
        ):
            kept[partition] = known
            return int(known[2])
        listed_at = time.time_ns()
        newest = max(self.files(partition), default=-1)
        # A folder changed just before the listing may have changed again within the same
        # timestamp tick, unseen: such a listing is used now, never kept.
        if folder_mtime < listed_at - INDEX_MARGIN_NS:
            kept[partition] = [folder_mtime, listed_at, newest]
        return newest

    # Spark side ---------------------------------------------------------------------------------

    def batch_files(self, metadata: Metadata) -> list[str]:
        """The files a batch reads. Raises ``FileNotFoundError`` if a partition went away."""
        paths = []
        for partition, (start, end) in sorted(dict(metadata).items()):
            if end <= start:
                continue
            seqs = self.files(partition)
            paths += [str(seqs[s]) for s in sorted(seqs) if start <= s < end]
        return paths

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        files = self.batch_files(metadata)
        if not files:
            raise ValueError(f"metadata {metadata!r} names no files")
        # Parse with from_json (not spark.read.json) so the raw line stays next to its parse result:
        # a malformed line keeps its text in _corrupt_record and its file in _metadata.
        lines = spark.read.text(files).where(F.trim("value") != "")
        parsed = F.from_json(
            "value",
            f"{self.schema}, {_CORRUPT} STRING",
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        )
        return lines.select(parsed.alias("r"), F.col("_metadata.file_path").alias(LOCATION))

    def malformed_records(self, batch: DataFrame) -> DataFrame | None:
        from pyspark.sql import functions as F

        return batch.where(F.col(f"r.{_CORRUPT}").isNotNull()).select(
            LOCATION, F.col(f"r.{_CORRUPT}").alias(RECORD)
        )

    def records(self, batch: DataFrame) -> DataFrame:
        return batch.select("r.*").drop(_CORRUPT)

    def describe_location(self, location: str, record: str) -> str:
        path = _local_path(location)
        try:  # only on the error path: find the line number for the person fixing the file
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if line.rstrip("\r\n") == record:
                        return f"{path}:{number}"
        except OSError:
            pass
        return path


# -- transactional, no data set needed: generated text -------------------------------------------

GENERATED_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: line numbers count from here
DEFAULT_VOCABULARY = tuple(
    "the cow jumped over the moon man went to store four score and seven years ago "
    "dog apple storm trident batch commit replay spark airflow".split()
)


@dataclasses.dataclass(frozen=True)
class GeneratedTextSource(TransactionalSource, SparkSource):
    """Lines of words generated at a steady rate: a replayable source that needs no data set.

    Line ``n`` of partition ``p`` exists once ``lines_per_second`` lines per partition have been
    "written" since 2026-01-01 up to ``n``; its words are a hash of ``(seed, p, n, position)``,
    so a batch (``{p: [start, end)}``) reads the same lines on every replay, on any Spark
    worker, with nothing on disk. The first txid reads the newest ``max_per_partition`` lines,
    not everything since 2026-01-01; after a pause the pipeline catches up ``max_per_partition``
    lines per txid at a time.

    What the example DAGs run out of the box; also a load generator (raise the rate).

    :param lines_per_second: arrival rate per partition.
    :param max_per_partition: batch size cap per partition.
    :param partitions: number of partitions (``p0``, ``p1``, …).
    :param words_per_line: words in a line.
    :param seed: a different seed generates different text.
    :param vocabulary: the words drawn from.
    """

    lines_per_second: float = 20.0
    max_per_partition: int = 500
    partitions: int = 2
    words_per_line: int = 8
    seed: int = 0
    vocabulary: tuple[str, ...] = DEFAULT_VOCABULARY

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        if self.lines_per_second <= 0:
            raise ValueError(f"lines_per_second must be > 0, got {self.lines_per_second}")
        for name in ("max_per_partition", "partitions", "words_per_line"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.vocabulary:
            raise ValueError("vocabulary must not be empty")

    # Airflow side -------------------------------------------------------------------------------

    def latest_offsets(self, now: float | None = None) -> dict[str, int]:
        import time

        elapsed = max((time.time() if now is None else now) - GENERATED_EPOCH, 0.0)
        newest = int(elapsed * self.lines_per_second)
        return {f"p{i}": newest for i in range(self.partitions)}

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        latest = self.latest_offsets()
        if prev_metadata is None:  # start at the newest lines, not at the epoch
            prev_metadata = {
                p: [max(end - self.max_per_partition, 0)] * 2 for p, end in latest.items()
            }
        # The offsets are the clock's: a worker whose clock is behind the one that began the
        # previous txid has no new lines yet, which is not a partition that went back.
        for p, (_, end) in dict(prev_metadata).items():
            if p in latest:
                latest[p] = max(latest[p], int(end))
        return next_offset_ranges(
            prev_metadata, latest, max_per_partition=self.max_per_partition, txid=txid
        )

    # Spark side ---------------------------------------------------------------------------------

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        words = F.array(*[F.lit(w) for w in self.vocabulary])
        frames = []
        for partition, (start, end) in sorted(dict(metadata).items()):
            if end <= start:
                continue
            rows = spark.range(int(start), int(end)).select(
                F.lit(partition).alias("p"), F.col("id").alias("offset")
            )
            picks = [
                F.element_at(
                    words,
                    (
                        F.pmod(
                            F.xxhash64(F.lit(self.seed), F.lit(partition), "offset", F.lit(i)),
                            F.lit(len(self.vocabulary)),
                        )
                        + 1
                    ).cast("int"),
                )
                for i in range(self.words_per_line)
            ]
            frames.append(rows.select("p", "offset", F.concat_ws(" ", *picks).alias("line")))
        if not frames:
            raise ValueError(f"metadata {metadata!r} names no lines")
        return functools.reduce(lambda a, b: a.unionByName(b), frames)
