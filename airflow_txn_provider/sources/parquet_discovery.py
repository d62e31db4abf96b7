"""How a Parquet dataset's new files are found (docs/sources.md): a folder is listed only if it
changed since some begin listed it, and only new names are read; files named by their first offset
are looked up by name from the partition's end instead."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import string
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_txn_provider.rules.exceptions import OffsetGapError
from airflow_txn_provider.sources.catalog import (
    MARGIN_NS,
    FileCatalog,
    Look,
    Partition,
    listing_holds,
    trusted,
)

if TYPE_CHECKING:
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

log = logging.getLogger(__name__)

RELIST_NAMED_NS = 3600 * 10**9
"""A folder of offset-named files is listed at least this often: files deleted leave the catalog."""


def check_template(template: str) -> None:
    """A ValueError saying what is wrong with a ``file_name_template`` (a file name holding
    ``{offset}`` or ``{offset:0<width>d}`` once, ``{partition}`` at will)."""
    try:
        fields = [f[1:] for f in string.Formatter().parse(template) if f[1] is not None]
    except ValueError as err:
        raise ValueError(f"file_name_template {template!r}: {err}") from None
    once = [f[0] for f in fields].count("offset") == 1
    problems = [] if once else ["must hold {offset} exactly once"]
    for field, spec, conversion in fields:
        if field not in ("offset", "partition"):
            problems.append(f"unknown field {{{field}}} (only {{offset}}, {{partition}})")
        elif conversion or (field == "partition" and spec):
            problems.append(f"{{{field}}} takes no conversion or format")
        elif field == "offset" and not re.fullmatch(r"0?[1-9][0-9]*d|d?", spec or ""):
            problems.append(f"{{offset:{spec}}}: use {{offset}} or {{offset:0<width>d}}")
    if "/" in template or os.sep in template:
        problems.append("names a file in the partition's folder: no '/'")
    if not template.endswith(".parquet") or template.startswith((".", "_")):
        problems.append("must end with .parquet and not start with '.' or '_'")
    if problems:
        raise ValueError(f"file_name_template {template!r}: {'; '.join(problems)}")


def file_offsets(file: str, column: str) -> tuple[int, int]:
    """The lowest and highest ``column`` value of a Parquet file (``(-1, -1)`` if it has none)."""
    import pyarrow.parquet as pq  # (a begin that finds no new file never needs pyarrow)

    meta = pq.ParquetFile(file).metadata
    names = meta.schema.names
    if column not in names:
        raise ValueError(f"{file} has no column {column!r} (columns: {names})")
    index = names.index(column)
    stats = [meta.row_group(g).column(index).statistics for g in range(meta.num_row_groups)]
    if all(s is not None and s.has_min_max for s in stats):
        values = [v for s in stats for v in (s.min, s.max)]
    else:  # a row group without statistics: read the column
        values = pq.read_table(file, columns=[column]).column(0).drop_null().to_pylist()
    return (int(min(values)), int(max(values))) if values else (-1, -1)


def _folder_of(name: str) -> str:
    """The folder holding a file or folder: ``"a/b.parquet"`` and ``"a/b/"`` are in ``"a/"``."""
    return name[: name.rstrip("/").rfind("/") + 1]


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


@dataclasses.dataclass
class _PartitionLook:
    """A look at one partition's folder against what the catalog knows of it."""

    catalog: FileCatalog
    key: str
    column: str
    template: str | None
    partition: str
    root: str
    known: Partition
    st: os.stat_result | None  # the folder's, taken as the look began (before any listing)
    names: list[str] | None = None  # the catalog's names of its files, when read already

    def lists(self) -> bool:
        """Whether its folder changed since a trusted listing: listed, its names compared."""
        return self.st is not None and not listing_holds(self.known, self.st)

    def _known_names(self) -> list[str]:
        if self.names is None:  # (a partition never listed has none)
            names = self.catalog.names(self.key, [self.partition]) if self.known.folders else {}
            self.names = names.get(self.partition, [])
        return self.names

    def look(self) -> Look:
        """What changed since ``known``; the files holding its newest offsets are read again if
        gone or rewritten, so a partition gone back is reported."""
        changed = set()
        for name, stamp in self.known.newest.items():
            st = _stat(os.path.join(self.root, name))
            if st is None or (st.st_size, st.st_mtime_ns) != stamp:
                changed.add(name)
        if self.template is not None and self.known.folders and not changed:
            return self._by_name()
        return self._listing(changed)

    def _by_name(self) -> Look:
        """The files named for the offsets from the partition's end, looked up one by one; the
        folder listed when due, or when it changed and no file has the next name."""
        assert self.template is not None
        known = self.known
        st, old = self.st, known.folders.get("", (0, 0, 0))  # (0, 0, 0): never listed
        if st is None or not stat.S_ISDIR(st.st_mode) or time.time_ns() - old[2] > RELIST_NAMED_NS:
            return self._listing(set())  # due: files deleted meanwhile leave the catalog
        same = old[:2] == (st.st_ino, st.st_mtime_ns)
        if same and trusted(old, st.st_ino, st.st_mtime_ns):
            return Look(known.folders)
        # Probed, not listed: never trusted (listed at most when last modified).
        look = Look({**known.folders, "": (st.st_ino, st.st_mtime_ns, min(old[2], st.st_mtime_ns))})
        end = known.end
        while True:
            name = self.template.format(offset=end, partition=self.partition)
            path = os.path.join(self.root, name)
            fst = _stat(path)
            if fst is None or not stat.S_ISREG(fst.st_mode):
                break
            try:
                low, high = file_offsets(path, self.column)
            except (OSError, ValueError):
                if fst.st_mtime_ns < time.time_ns() - MARGIN_NS:  # not a file being written
                    raise
                return look if look.added else Look(known.folders)  # the rest: next time
            if low != end:
                raise OffsetGapError(
                    f"partition {self.partition!r}: {path} is named for offset {end} but its "
                    f"first offset is {low}: files named by their first offset must hold "
                    "consecutive offsets",
                    partition=self.partition,
                    file=path,
                )
            look.added[name] = (fst.st_size, fst.st_mtime_ns, low, high)
            end = high + 1
        if look.added or same:
            return look if look.added else Look(known.folders)
        look = self._listing(set())
        expected = self.template.format(offset=known.end, partition=self.partition)
        after = sorted((f[2], f[1], n) for n, f in look.added.items() if f[2] >= known.end)
        if after and expected not in look.added:
            low, mtime_ns, name = after[0]
            if mtime_ns >= time.time_ns() - MARGIN_NS:
                return Look(known.folders)  # files landing out of order: looked at next time
            path = os.path.join(self.root, name)
            raise OffsetGapError(
                f"partition {self.partition!r}: no file {expected} (offset {known.end}) but "
                f"{path} holds offsets from {low}: a gap in the files' names (every begin fails "
                "until the missing file lands)",
                partition=self.partition,
                file=path,
            )
        return look

    def _listing(self, reread: set[str]) -> Look:
        """The folders changed since a trusted listing, listed: only new names (and ``reread``)."""
        look, known = Look({}, {}, set(reread)), self.known
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            path = os.path.join(self.root, rel_dir) if rel_dir else self.root
            st = _stat(path) if rel_dir else self.st
            if st is None or not stat.S_ISDIR(st.st_mode):
                continue
            old = known.folders.get(rel_dir)
            again = {n[len(rel_dir) :] for n in reread if _folder_of(n) == rel_dir}
            if trusted(old, st.st_ino, st.st_mtime_ns) and not again:
                look.folders[rel_dir] = old
                pending += [d for d in known.folders if d and _folder_of(d) == rel_dir]
                continue
            listed_at = time.time_ns()
            try:
                listed = os.listdir(path)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            names = self._known_names()
            here = names  # those right in it, relative to it
            if rel_dir or known.folders.keys() - {""}:
                here = [n[len(rel_dir) :] for n in names if _folder_of(n) == rel_dir]
            if old is not None and old[0] != st.st_ino:  # replaced: every name looked at again
                again = set(here)
            new = set(listed)
            new.difference_update(here)  # (no set of the known names built: faster)
            gone = set() if len(listed) - len(new) == len(here) else set(here) - set(listed)
            look.dropped |= {rel_dir + n for n in gone | again}
            for name in new | (again - gone):
                if name.startswith((".", "_")):
                    continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc, _temporary)
                rel, full = rel_dir + name, os.path.join(path, name)
                try:
                    rel.encode()
                except UnicodeEncodeError:  # Postgres text cannot hold it; as bytes in the log
                    log.warning("%r: a name that is not UTF-8 is not read", os.fsencode(full))
                    continue
                if "\n" in name:  # the catalog keeps names newline-separated
                    log.warning("%r: a name with a newline is not read", full)
                    continue
                fst = _stat(full)
                if fst is not None and stat.S_ISDIR(fst.st_mode):
                    pending.append(rel + "/")
                elif fst is not None and stat.S_ISREG(fst.st_mode) and name.endswith(".parquet"):
                    offsets = file_offsets(full, self.column)
                    look.added[rel] = (fst.st_size, fst.st_mtime_ns, *offsets)
            look.folders[rel_dir] = (st.st_ino, st.st_mtime_ns, listed_at)
        for gone_dir in known.folders.keys() - look.folders.keys():  # folders gone: their files
            look.dropped |= {n for n in self._known_names() if n.startswith(gone_dir)}
        look.dropped -= look.added.keys()
        return look


def discover(
    source: PartitionedParquetSource,
    partitions: Mapping[str, str | os.PathLike[str]],
    *,
    by_name: bool = True,
    complete: bool = False,
) -> dict[str, Partition]:
    """Each partition (value -> folder) brought up to date in ``source``'s catalog. ``by_name``:
    by its ``file_name_template``; ``complete``: these are all (the others are forgotten)."""
    catalog, key = source.catalog, source.catalog_key()
    template = source.file_name_template if by_name else None
    known = catalog.partitions(key)
    found: dict[str, Partition] = {}
    looks: dict[str, Look] = {}
    shared = (catalog, key, source.offset_column, template)
    looking = {
        p: _PartitionLook(*shared, p, str(r), known.get(p, Partition()), _stat(str(r)))
        for p, r in partitions.items()
    }
    listed = [p for p, seen in looking.items() if p in known and seen.lists()]
    if template is None and listed:  # their known names in one query
        for p, names in catalog.names(key, listed).items():
            looking[p].names = names
    for p, seen in looking.items():
        part = seen.known
        look = seen.look()
        if look.added or look.dropped or look.folders != part.folders:
            looks[p] = look
        else:
            found[p] = part  # as known: nothing to record
    if looks:
        found |= catalog.record(key, looks)
    if complete and known.keys() - partitions.keys():
        catalog.forget(key, known.keys() - partitions.keys())
    return found
