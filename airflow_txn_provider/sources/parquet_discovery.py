"""How a Parquet dataset's new files are found: by listing changed folders, or, for files named
by their first offset, by looking up the next name (docs/sources.md, "How the built-in sources
find new data").

Files are immutable once complete (the transactional-source contract): one rewritten in place is
caught only if it holds the newest offsets.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import string
import time
from collections.abc import Mapping
from pathlib import Path

from airflow_txn_provider.rules.exceptions import OffsetGapError
from airflow_txn_provider.sources.file_index import INDEX_MARGIN_NS, file_offsets
from airflow_txn_provider.sources.parquet_index import (
    CorruptIndexError,
    ParquetPartition,
    ParquetPartitionIndex,
    StaleIndexError,
    parquet_index_folder,
    prune_parquet_indexes,
)

log = logging.getLogger(__name__)

_OFFSET_SPEC = re.compile(r"0?[1-9][0-9]*d|d?")


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
        offsets = [f for f in fields if f[0] == "offset"]
        if len(offsets) != 1:
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


def discover(
    partitions: Mapping[str, Path],
    *,
    dataset: str,
    column: str,
    index_dir: str | None,
    names: OffsetNames | None,
    complete: bool,
    stamps: dict[str, tuple[int, int]] | None = None,
    table: bool = False,
) -> dict[str, ParquetPartition]:
    """Each partition's discovery state, brought up to date (and saved when it changed).
    ``names``: files named by their first offset (probed, not listed); ``complete``:
    ``partitions`` are all there are (the others' indexes are deleted); ``stamps``: filled with
    every folder looked at (``(inode, mtime_ns)``); ``table``: with each file's offset range
    loaded (the Spark side)."""
    folder = parquet_index_folder(index_dir, dataset, column)
    found: dict[str, ParquetPartition] = {}
    for p, directory in partitions.items():
        index = ParquetPartitionIndex(folder, directory.name, dataset, column)
        root = str(directory)
        part = index.load(table=table)
        for again in (False, True):
            try:
                if names is None:
                    changed = refresh_by_listing(part, root, column, stamps)
                else:
                    changed = refresh_by_name(part, root, column, stamps, names, p)
                    if changed and part.at is not None and index.compaction_due(part):
                        # Written whole anyway: list once, so files deleted since (retention)
                        # leave the table; amortised over the appends before it.
                        refresh_by_listing(part, root, column, stamps, relist=True)
                break
            except StaleIndexError:  # replaced by another process meanwhile: start from it
                if again:
                    raise
                part = index.load(table=True)
        if changed or part.rewrite:
            index.save(part)
        found[p] = part
    if complete:
        prune_parquet_indexes(folder, {d.name for d in partitions.values()})
    return found


# -- by name: files named by their first offset ---------------------------------------------


def refresh_by_name(
    part: ParquetPartition,
    root: str,
    column: str,
    stamps: dict[str, tuple[int, int]] | None,
    names: OffsetNames,
    partition: str,
) -> bool:
    """Bring ``part`` up to date by looking up (``stat``) the file named for its end, then for
    that file's end, … (O(new files)); the folder is listed only when nothing is known yet, or
    when it changed and no file has the next name (files deleted, a stray file, a gap)."""
    try:
        st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        st = None
    if not part.dirs or st is None or not stat.S_ISDIR(st.st_mode):
        return refresh_by_listing(part, root, column, stamps)
    if stamps is not None:
        stamps[root] = (st.st_ino, st.st_mtime_ns)
    old = part.dirs.get("")
    same = old is not None and old[0] == st.st_ino and old[1] == st.st_mtime_ns
    if same and old is not None and old[1] < old[2] - INDEX_MARGIN_NS:
        return verify_newest(part, root, column, {}, {}, list(part.newest))
    before = part.end
    found, waiting = _probe(part, root, column, names, partition)
    if found:
        # Probed, not listed: what else the folder holds is not known, so never trusted.
        part.dirs = {**part.dirs, "": [st.st_ino, st.st_mtime_ns, 0]}
        return verify_newest(part, root, column, found, {}, [list(found)[-1]]) or True
    if same or waiting:
        return verify_newest(part, root, column, {}, {}, list(part.newest))
    # The folder changed, yet no file has the next name: list it (drops deleted files).
    trial = part.copy()
    changed = refresh_by_listing(trial, root, column, stamps)
    expected = names.name(partition, before)
    if trial.end > before and not os.path.exists(os.path.join(root, expected)):
        if _gap_is_young(trial, root, partition, expected, before):
            return False  # files landing out of order: kept out, looked at again next time
    part.__dict__.update(trial.__dict__)
    return changed


def _probe(
    part: ParquetPartition, root: str, column: str, names: OffsetNames, partition: str
) -> tuple[dict[str, list[int]], bool]:
    """The files named for ``part.end`` onwards, added to ``part`` (rel -> ``[size, mtime]``),
    and whether the next one is there but still being written."""
    found: dict[str, list[int]] = {}
    while True:
        rel = names.name(partition, part.end)
        full = os.path.join(root, rel)
        try:
            fst = os.stat(full)
        except FileNotFoundError:
            return found, False
        if not stat.S_ISREG(fst.st_mode):
            return found, False
        try:
            low, high = file_offsets(full, fst.st_mtime_ns, fst.st_size, column)
        except (OSError, ValueError):
            # No footer yet: a file written in place, still being written. Looked at again
            # next time; one that stays unreadable past the margin is an error.
            if fst.st_mtime_ns >= time.time_ns() - INDEX_MARGIN_NS:
                return found, True
            raise
        if low != part.end:
            raise OffsetGapError(
                f"partition {partition!r}: {full} is named for offset {part.end} but its first "
                f"offset is {low}: files named by their first offset must hold consecutive "
                "offsets",
                partition=partition,
                file=full,
            )
        part.add(rel, low, high)
        part.end = high + 1
        found[rel] = [fst.st_size, fst.st_mtime_ns]


def _gap_is_young(
    part: ParquetPartition, root: str, partition: str, expected: str, end: int
) -> bool:
    """Raise :class:`OffsetGapError` for the first file after the missing one, unless it is
    younger than the margin (``True``: files landing out of order, looked at again next time).
    ``False``: no file after it."""
    after = sorted((low, rel) for rel, (low, _) in part.ranges().items() if low >= end)
    if not after:
        return False
    low, rel = after[0]
    full = os.path.join(root, rel)
    try:
        young = os.stat(full).st_mtime_ns >= time.time_ns() - INDEX_MARGIN_NS
    except FileNotFoundError:
        young = True
    if young:
        return True
    raise OffsetGapError(
        f"partition {partition!r}: no file {expected} (offset {end}) but {full} holds offsets "
        f"from {low}: a gap in the files' names (every begin fails until the missing file lands)",
        partition=partition,
        file=full,
    )


# -- by listing: folders changed since the index's listing -----------------------------------


def _parent(rel_dir: str) -> str:
    """``"a/b/"`` -> ``"a/"``, ``"a/"`` -> ``""``."""
    return rel_dir[: rel_dir.rstrip("/").rfind("/") + 1]


def refresh_by_listing(
    part: ParquetPartition,
    root: str,
    column: str,
    stamps: dict[str, tuple[int, int]] | None,
    *,
    relist: bool = False,
) -> bool:
    """Bring ``part`` up to date with the folder ``root``; ``True`` if it changed. A folder
    unchanged since a trusted listing is not listed again (unless ``relist``); a changed one is
    listed by name and only names the table does not know are looked at."""
    try:
        return _listing(part, root, column, stamps, relist)
    except CorruptIndexError as err:
        log.warning("discovery index of %s unusable, rebuilt: %s", root, err)
        part.reset()
        return _listing(part, root, column, stamps, relist) or True


def _listing(
    part: ParquetPartition,
    root: str,
    column: str,
    stamps: dict[str, tuple[int, int]] | None,
    relist: bool,
) -> bool:
    before = part.dirs
    visited: dict[str, list[int]] = {}
    gone: set[str] = set()
    fresh: dict[str, tuple[int, int, int, int]] = {}  # rel -> size, mtime_ns, low, high
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        path = os.path.join(root, rel_dir) if rel_dir else root
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # gone or unreadable: holds nothing
        if not stat.S_ISDIR(st.st_mode):
            continue
        if stamps is not None:
            stamps[path] = (st.st_ino, st.st_mtime_ns)
        old = before.get(rel_dir)
        if (
            not relist
            and old is not None
            and old[0] == st.st_ino
            and old[1] == st.st_mtime_ns
            and old[1] < old[2] - INDEX_MARGIN_NS
        ):
            visited[rel_dir] = old  # unchanged since a listing well after its last change
            pending += [d for d in before if d and _parent(d) == rel_dir]
            continue
        listed_at = time.time_ns()
        try:
            listed = os.listdir(path)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        known = part.known_in(rel_dir)
        replaced = old is not None and old[0] != st.st_ino
        if replaced:  # every name is looked at again
            gone |= {rel_dir + name for name in known}
            known = set()
        new = [name for name in listed if name not in known]
        if len(listed) - len(new) != len(known):  # some known names are gone
            present = set(listed)
            gone |= {rel_dir + name for name in known if name not in present}
        trusted = True
        for name in new:
            if name.startswith((".", "_")):
                continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc, _temporary)
            rel = rel_dir + name
            if rel + "/" in before and not replaced:
                pending.append(rel + "/")
                continue
            full = os.path.join(path, name)
            try:
                fst = os.stat(full)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(fst.st_mode):
                pending.append(rel + "/")
            elif name.endswith(".parquet") and stat.S_ISREG(fst.st_mode):
                low, high = file_offsets(full, fst.st_mtime_ns, fst.st_size, column)
                fresh[rel] = (fst.st_size, fst.st_mtime_ns, low, high)
                if "\n" in rel or "\r" in rel:
                    trusted = False  # cannot be kept in the table: list it every time
        # A folder changed just before it was listed may change again within its timestamp
        # tick, unseen: such a listing is used now and listed again next time.
        if st.st_mtime_ns >= listed_at - INDEX_MARGIN_NS:
            trusted = False
        visited[rel_dir] = [st.st_ino, st.st_mtime_ns, listed_at if trusted else 0]
    for rel_dir in set(before) - set(visited):  # folders gone: their files too
        gone |= {rel_dir + name for name in part.known_in(rel_dir)}
    changed = visited != before
    part.dirs = visited
    storable = {rel: f for rel, f in fresh.items() if "\n" not in rel and "\r" not in rel}
    if gone:  # (names found again in a replaced folder are in gone, and fresh)
        part.drop(gone)
        changed = True
    for rel, f in storable.items():
        part.add(rel, f[2], f[3])
        changed = True
    verified = {rel: [f[0], f[1]] for rel, f in fresh.items()}
    extra = {rel: f[3] for rel, f in fresh.items() if rel not in storable}
    if gone & part.newest.keys():
        newest = _recompute(part, extra)
    else:  # the newest files are still there: the end moves only by new files
        top = max([part.end - 1, *(f[3] for f in fresh.values())])
        newest = [r for r in part.newest if part.end - 1 == top] + [
            r for r, f in fresh.items() if f[3] == top and r not in part.newest
        ]
        part.end = top + 1
        if top < 0:
            newest = []
    return verify_newest(part, root, column, verified, extra, newest) or changed


def verify_newest(
    part: ParquetPartition,
    root: str,
    column: str,
    verified: dict[str, list[int]],
    extra: dict[str, int],
    newest: list[str],
) -> bool:
    """Look at the files holding the newest offsets (``newest``, and those of the previous
    look): one rewritten in place (against the contract) is read again, so a partition that
    went back is reported; one gone gives the end back to the next newest. ``verified``: files
    looked at already (rel -> ``[size, mtime]``); ``extra``: files not kept in the table
    (rel -> highest offset). Sets ``part.newest``; ``True`` if anything changed."""
    changed = False
    previous = [r for r in part.newest if r not in part.dropped or r in part.added]
    while True:
        todo = [rel for rel in [*newest, *previous] if rel not in verified]
        if not todo:
            break
        rel = todo[0]
        full = os.path.join(root, rel)
        try:
            fst = os.stat(full)
        except FileNotFoundError:
            part.drop({rel})
            extra.pop(rel, None)
            verified[rel] = [-1, -1]  # gone: looked at, not looked at again
            newest, changed = _recompute(part, extra), True
            continue
        stamp = [fst.st_size, fst.st_mtime_ns]
        verified[rel] = stamp
        if rel in part.newest and part.newest[rel] != stamp:
            low, high = file_offsets(full, fst.st_mtime_ns, fst.st_size, column)
            log.warning(
                "%s was rewritten in place (size or modification time changed): files must "
                "not change once complete; offsets now [%s, %s]",
                full,
                low,
                high,
            )
            part.drop({rel})
            part.add(rel, low, high)
            newest, changed = _recompute(part, extra), True
    newest_stamps = {rel: verified[rel] for rel in newest}
    if newest_stamps != part.newest:
        part.newest, changed = newest_stamps, True
    return changed


def _recompute(part: ParquetPartition, extra: Mapping[str, int]) -> list[str]:
    """``end`` from the whole table (and ``extra`` files, not kept in it); the files holding
    the highest offset."""
    highs = {name: high for name, (_, high) in part.ranges().items()}
    highs.update(extra)
    top = max(highs.values(), default=-1)
    part.end = top + 1
    return [name for name, high in highs.items() if high == top] if top >= 0 else []
