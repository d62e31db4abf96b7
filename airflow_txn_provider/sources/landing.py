"""The landing folder source: numbered JSON-lines files, one sub-folder per partition (opaque).

A partition whose folder is missing or unreadable is skipped and continues later from where it
stopped, so a replay may differ: pair this source with opaque state, which keeps results exact.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_txn_provider.rules.sources import Metadata, OpaqueSource, next_offset_ranges
from airflow_txn_provider.sources.base import LOCATION, RECORD, SparkSource, local_path
from airflow_txn_provider.sources.catalog import Look, Partition, UsesCatalog, listing_holds
from airflow_txn_provider.utils.lineage import path_dataset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_SEQ_FILE = re.compile(r"^(\d+)\.jsonl$")
_CORRUPT = "_corrupt_record"


@dataclasses.dataclass(frozen=True)
class LandingDirectorySource(UsesCatalog, OpaqueSource, SparkSource):
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
    :param index_dir: ignored (a listing's answer is kept in the log's Postgres:
        :mod:`~airflow_txn_provider.sources.catalog`); accepted so that DAG files and stored
        specs of earlier versions load.
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
        numbers from 0 again is caught (:class:`~airflow_txn_provider.rules.exceptions.
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
        # The catalog's answer at the last call (a waker polls with one object): a folder still
        # as a trusted listing in it found it is unchanged since, however old the answer.
        known: dict[str, Partition] = self.__dict__.get("_catalog_answer", {})
        looks: dict[str, Look] = {}
        asked, latest = False, {}
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if entry.name.startswith((".", "_")) or not entry.is_dir():
                continue
            start = int(starts.get(entry.name, 0))
            try:
                found = self._probe(entry.path, start)
                if found:
                    latest[entry.name] = start + found
                    continue
                st = os.stat(entry.path)
                if not asked and not listing_holds(known.get(entry.name), st):
                    known, asked = self.catalog.partitions(self.catalog_key()), True
                    object.__setattr__(self, "_catalog_answer", known)
                newest = self._newest(entry.name, st, known.get(entry.name), looks)
            except OSError as err:
                log.warning("landing partition %s unavailable, skipped: %s", entry.path, err)
                continue
            if newest >= 0:
                latest[entry.name] = newest + 1
        if looks:
            self.catalog.record(self.catalog_key(), looks)
        return latest

    def catalog_key(self) -> str:
        return f"landing:{os.path.abspath(self.path)}"

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

    def _newest(
        self, partition: str, st: os.stat_result, known: Partition | None, looks: dict[str, Look]
    ) -> int:
        """The partition's highest file number (-1: none), from the catalog while its folder
        (``st``) is unchanged since a listing that began well after the folder's last change,
        else listed (the listing added to ``looks``: its folder's stamps and newest file)."""
        if listing_holds(known, st):
            return known.end - 1
        listed_at = time.time_ns()
        numbers = self.files(partition)
        newest = max(numbers, default=-1)
        folders = {"": (st.st_ino, st.st_mtime_ns, listed_at)}
        added = {}
        if newest >= 0:
            fst = numbers[newest].stat()
            added[numbers[newest].name] = (fst.st_size, fst.st_mtime_ns, newest, newest)
        dropped = set(known.newest) - set(added) if known is not None else set()
        looks[partition] = Look(folders, added, dropped)
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

    def lineage_dataset(self) -> tuple[str, str]:
        return path_dataset(self.path)

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
        path = local_path(location)
        try:  # only on the error path: find the line number for the person fixing the file
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    if line.rstrip("\r\n") == record:
                        return f"{path}:{number}"
        except OSError:
            pass
        return path
