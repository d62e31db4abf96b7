"""How a Parquet dataset's new files are found: by listing the folders that changed since some
begin listed them, or, for files named by their first offset, by looking up the next names
(docs/sources.md, "How the built-in sources find new data"). What is found is kept in the
source's catalog (:mod:`~airflow_txn_provider.sources.catalog`), so each footer is read once.

Files are immutable once complete (the transactional-source contract): the files holding a
partition's newest offsets are looked at on every begin, an older one rewritten in place is not.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import string
import time
from collections.abc import Mapping

from airflow_txn_provider.rules.exceptions import OffsetGapError
from airflow_txn_provider.sources.catalog import (
    MARGIN_NS,
    FileCatalog,
    FileFacts,
    Folder,
    Look,
    Partition,
    trusted,
)

log = logging.getLogger(__name__)

_OFFSET_SPEC = re.compile(r"0?[1-9][0-9]*d|d?")
RELIST_NAMED_NS = 3600 * 10**9
"""A folder of offset-named files is listed at least this often, so files deleted meanwhile
(retention) leave the catalog; between listings a begin looks up the next names only."""


class OffsetNames:
    """File names that carry the file's first offset, from a template such as
    ``"part-{offset:010d}.parquet"`` or Kafka Connect's ``"events+{partition}+{offset:010d}
    .parquet"`` (``{partition}``: the partition value)."""

    def __init__(self, template: str) -> None:
        fields = []
        try:
            for literal, field, spec, conversion in string.Formatter().parse(template):
                if field is not None:
                    fields.append((field, spec or "", conversion))
                if "/" in literal or os.sep in literal:
                    raise ValueError("names a file in the partition's folder: no '/'")
        except ValueError as err:
            raise ValueError(f"file_name_template {template!r}: {err}") from None
        problems = []
        if len([f for f in fields if f[0] == "offset"]) != 1:
            problems.append("must hold {offset} exactly once")
        for field, spec, conversion in fields:
            if field not in ("offset", "partition"):
                problems.append(f"unknown field {{{field}}} (only {{offset}}, {{partition}})")
            elif conversion or (field == "partition" and spec):
                problems.append(f"{{{field}}} takes no conversion or format")
            elif field == "offset" and not _OFFSET_SPEC.fullmatch(spec):
                problems.append(f"{{offset:{spec}}}: use {{offset}} or {{offset:0<width>d}}")
        if not template.endswith(".parquet") or template.startswith((".", "_")):
            problems.append("must end with .parquet and not start with '.' or '_'")
        if problems:
            raise ValueError(f"file_name_template {template!r}: {'; '.join(problems)}")
        self.template = template

    def name(self, partition: str, offset: int) -> str:
        return self.template.format(offset=offset, partition=partition)


def file_offsets(file: str, column: str) -> tuple[int, int]:
    """The lowest and highest ``column`` value of one Parquet file (``(-1, -1)`` if it has none),
    from its footer's statistics (the column itself where a row group has none)."""
    import pyarrow.parquet as pq  # (a begin that finds no new file never needs pyarrow)

    meta = pq.ParquetFile(file).metadata
    names = meta.schema.names
    if column not in names:
        raise ValueError(f"{file} has no column {column!r} (columns: {names})")
    index = names.index(column)
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            values = pq.read_table(file, columns=[column]).column(0).to_pylist()
            present = [int(v) for v in values if v is not None]
            return (min(present), max(present)) if present else (-1, -1)
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else (-1, -1)


class PartitionDiscovery:
    """One partition's folder, looked at (:meth:`look`) against what the catalog knows."""

    def __init__(
        self,
        catalog: FileCatalog,
        source: str,
        partition: str,
        root: str,
        column: str,
        names: OffsetNames | None,
        stamps: dict[str, tuple[int, int]] | None,
    ) -> None:
        self.catalog, self.source, self.partition = catalog, source, partition
        self.root, self.column, self.names, self.stamps = root, column, names, stamps

    def look(self, known: Partition) -> Partition | Look:
        """``known`` when the partition is as the catalog knows it, else what changed."""
        rewritten = self._newest_changed(known)
        if self.names is not None and known.folders and not rewritten:
            found = self._by_name(known)
            if found is not None:
                return found
        folders, added, dropped = self._listing(known, rewritten)
        if not added and not dropped and folders == known.folders:
            return known
        return Look(folders, added, dropped)

    def _stat(self, path: str) -> os.stat_result | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return None
        if self.stamps is not None and stat.S_ISDIR(st.st_mode):
            self.stamps[path] = (st.st_ino, st.st_mtime_ns)
        return st

    def _newest_changed(self, known: Partition) -> set[str]:
        """The files that held the newest offsets and are gone or rewritten (against the
        contract: read again, so a partition that went back is reported)."""
        changed = set()
        for name, (size, mtime_ns) in known.newest.items():
            st = self._stat(os.path.join(self.root, name))
            if st is None or (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                changed.add(name)
        return changed

    # -- by name ----------------------------------------------------------------------------

    def _by_name(self, known: Partition) -> Partition | Look | None:
        """The next names looked up from the partition's end, O(new files); ``None``: the
        folder must be listed (it changed and no file has the next name, or it is due)."""
        assert self.names is not None
        st = self._stat(self.root)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return None
        old = known.folders.get("")
        if old is None or time.time_ns() - old[2] > RELIST_NAMED_NS:
            return None
        same = old[:2] == (st.st_ino, st.st_mtime_ns)
        if same and trusted(old, st.st_ino, st.st_mtime_ns):
            return known
        added: dict[str, FileFacts] = {}
        end, waiting, last = known.end, False, ""
        while True:
            name = self.names.name(self.partition, end)
            full = os.path.join(self.root, name)
            fst = self._stat(full)
            if fst is None or not stat.S_ISREG(fst.st_mode):
                break
            try:
                low, high = file_offsets(full, self.column)
            except (OSError, ValueError):
                # No footer yet: still being written. Looked at again next time; one that
                # stays unreadable past the margin is an error.
                if fst.st_mtime_ns >= time.time_ns() - MARGIN_NS:
                    waiting = True
                    break
                raise
            if low != end:
                raise OffsetGapError(
                    f"partition {self.partition!r}: {full} is named for offset {end} but its "
                    f"first offset is {low}: files named by their first offset must hold "
                    "consecutive offsets",
                    partition=self.partition,
                    file=full,
                )
            added[name] = (fst.st_size, fst.st_mtime_ns, low, high)
            end, last = high + 1, name
        if added:  # probed, not listed: never trusted (listed at most when last modified)
            folders = {
                **known.folders,
                "": (st.st_ino, st.st_mtime_ns, min(old[2], st.st_mtime_ns)),
            }
            after = Partition(folders, end, {last: added[last][:2]})
            return Look(folders, added, after=after)
        if same or waiting:
            return known
        return self._gap_or_listing(known)

    def _gap_or_listing(self, known: Partition) -> Partition | Look:
        """The folder changed, yet no file has the next name: files deleted, a stray file, or a
        gap: an :class:`OffsetGapError` for the first file past it, unless younger than the
        margin (files landing out of order: the partition as it was, looked at next time)."""
        assert self.names is not None
        folders, added, dropped = self._listing(known, set())
        expected = self.names.name(self.partition, known.end)
        after = sorted((f[2], n) for n, f in added.items() if f[2] >= known.end)
        if after and expected not in added:
            low, name = after[0]
            if added[name][1] >= time.time_ns() - MARGIN_NS:
                return known
            raise OffsetGapError(
                f"partition {self.partition!r}: no file {expected} (offset {known.end}) but "
                f"{os.path.join(self.root, name)} holds offsets from {low}: a gap in the files' "
                "names (every begin fails until the missing file lands)",
                partition=self.partition,
                file=os.path.join(self.root, name),
            )
        return Look(folders, added, dropped)

    # -- by listing -------------------------------------------------------------------------

    def _listing(
        self, known: Partition, reread: set[str]
    ) -> tuple[dict[str, Folder], dict[str, FileFacts], set[str]]:
        """The partition's folders listed where they changed since a trusted listing, by name:
        only names the catalog does not know (and ``reread``) are looked at."""
        folders: dict[str, Folder] = {}
        added: dict[str, FileFacts] = {}
        dropped: set[str] = set(reread)
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            path = os.path.join(self.root, rel_dir) if rel_dir else self.root
            st = self._stat(path)
            if st is None or not stat.S_ISDIR(st.st_mode):
                continue
            old = known.folders.get(rel_dir)
            suspect = any(r[: r.rfind("/") + 1] == rel_dir for r in reread)
            if trusted(old, st.st_ino, st.st_mtime_ns) and not suspect:
                assert old is not None
                folders[rel_dir] = old
                pending += [d for d in known.folders if d and _parent(d) == rel_dir]
                continue
            listed_at = time.time_ns()
            try:
                listed = os.listdir(path)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            cut, flat = len(rel_dir), not any(known.folders.keys() - {""})
            known_names = self.catalog.names(self.source, self.partition, rel_dir, direct=not flat)
            here = {n[cut:] for n in known_names} if cut else known_names
            if old is not None and old[0] != st.st_ino:  # replaced: every name looked at again
                dropped |= {rel_dir + n for n in here}
                here = set()
            present = set(listed)
            dropped |= {rel_dir + n for n in here - present}
            again = {r[cut:] for r in reread if r[: r.rfind("/") + 1] == rel_dir}
            for name in (present - here) | (again & present):
                if name.startswith((".", "_")):
                    continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc, _temporary)
                rel = rel_dir + name
                if not _storable(rel):
                    log.warning(  # as bytes: the name's lone surrogates break handlers
                        "%r: a name that is not UTF-8 is not read",
                        os.fsencode(os.path.join(path, name)),
                    )
                    continue
                full = os.path.join(path, name)
                fst = self._stat(full)
                if fst is None:
                    continue
                if stat.S_ISDIR(fst.st_mode):
                    pending.append(rel + "/")
                elif name.endswith(".parquet") and stat.S_ISREG(fst.st_mode):
                    low, high = file_offsets(full, self.column)
                    added[rel] = (fst.st_size, fst.st_mtime_ns, low, high)
            folders[rel_dir] = (st.st_ino, st.st_mtime_ns, listed_at)
        for gone in set(known.folders) - set(folders):  # folders gone: their files too
            dropped |= self.catalog.names(self.source, self.partition, gone, direct=True)
        return folders, added, dropped - set(added)


def _storable(name: str) -> bool:
    """Whether the catalog (Postgres text) can hold ``name``: a name of bytes that are not
    UTF-8 (kept by Python as lone surrogates) cannot."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parent(rel_dir: str) -> str:
    """``"a/b/"`` -> ``"a/"``, ``"a/"`` -> ``""``."""
    return rel_dir[: rel_dir.rstrip("/").rfind("/") + 1]


def discover(
    catalog: FileCatalog,
    source: str,
    partitions: Mapping[str, str],
    *,
    column: str,
    names: OffsetNames | None,
    complete: bool = False,
    stamps: dict[str, tuple[int, int]] | None = None,
) -> dict[str, Partition]:
    """Each partition (value -> folder) brought up to date in ``catalog``. ``complete``:
    ``partitions`` are all there are (what is known of others is forgotten); ``stamps``:
    filled with every folder looked at (``(inode, mtime_ns)``)."""
    known = catalog.partitions(source)
    found: dict[str, Partition] = {}
    looks: dict[str, Look] = {}
    for p, root in partitions.items():
        seen = PartitionDiscovery(catalog, source, p, root, column, names, stamps)
        answer = seen.look(known.get(p) or Partition())
        if isinstance(answer, Look):
            looks[p] = answer
        else:
            found[p] = answer
    found.update(catalog.record_all(source, looks) if looks else {})
    if complete and set(known) - set(partitions):
        catalog.forget(source, set(known) - set(partitions))
    return found
