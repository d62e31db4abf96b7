"""Where a Parquet dataset's offsets are, found without reading the whole dataset at every begin.

A begin needs each partition's newest offset, and a batch's read needs the files holding its
offsets. Both come from a small index persisted per partition (in ``index_dir``; see
docs/sources.md, "How the built-in sources find new data"): a folder unchanged since it was
indexed is not listed again, a changed one is listed by name and only new files' footers are read.
Files are immutable once written (the transactional-source contract): one rewritten in place is
caught only if it holds the newest offsets.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


def max_offset(directory: Path, column: str) -> int:
    return max((high for _, (_, high) in offset_ranges(directory, column)), default=-1)


def offset_ranges(directory: Path, column: str) -> list[tuple[Path, tuple[int, int]]]:
    """Each Parquet file under ``directory`` with its lowest and highest ``column`` value."""
    found = []
    for file in sorted(directory.rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in file.relative_to(directory).parts):
            continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc, _temporary)
        stat = file.stat()
        found.append((file, file_offsets(str(file), stat.st_mtime_ns, stat.st_size, column)))
    return found


@functools.lru_cache(maxsize=65_536)
def file_offsets(file: str, mtime_ns: int, size: int, column: str) -> tuple[int, int]:
    """The lowest and highest ``column`` value of one Parquet file (``(-1, -1)`` if it has none),
    from its footer's statistics; cached by the file's modification time and size, so a file is
    read again only once rewritten."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(file).metadata
    names = meta.schema.names
    if column not in names:
        raise ValueError(f"{file} has no column {column!r} (columns: {names})")
    index = names.index(column)
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:  # no statistics: read just this column
            values = pq.read_table(file, columns=[column]).column(0).to_pylist()
            present = [int(v) for v in values if v is not None]
            return (min(present), max(present)) if present else (-1, -1)
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else (-1, -1)


# -- discovery that does not grow with history: a persisted index ------------------------------

INDEX_MARGIN_NS = 2_000_000_000
"""A file or directory modified less than this before it was looked at may change again within
the same timestamp tick: what was read from it is used once, never persisted."""
_INDEX_VERSION = 1
loaded_indexes: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def write_whole(folder: str, file: str, data: bytes) -> os.stat_result:
    """Replace ``file`` (in ``folder``, created private) by ``data`` at once: written to a
    temporary file beside it, then ``os.replace``d, so a reader or a racing writer sees one whole
    version or the other. Returns the new file's stat."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return os.stat(file)


def default_index_dir() -> str:
    """Where sources keep their discovery indexes unless told: a private folder of the user's
    under the system temp dir (``$TMPDIR`` or ``/tmp``)."""
    return os.path.join(tempfile.gettempdir(), f"airflow-txn-index-{os.getuid()}")


class DiscoveryIndex:
    """A small JSON file of what discovery found, per dataset, in ``index_dir``; shared by the
    processes of one machine. Written whole (a temporary file, then ``os.replace``), so a reader
    sees an old or a new index, never half of one; when two processes race, the last write wins,
    and either is right, as every entry is used only while the file or folder it describes is
    unchanged. Unreadable, corrupt or foreign → empty: everything is looked at again."""

    def __init__(self, index_dir: str | None, kind: str, dataset: str, *key: str) -> None:
        self.folder = index_dir or default_index_dir()
        digest = hashlib.sha256(
            "\0".join([kind, os.path.realpath(dataset), *key]).encode()
        ).hexdigest()[:32]
        self.file = os.path.join(self.folder, f"{kind}-{digest}.json")
        self.ident = {"version": _INDEX_VERSION, "kind": kind, "dataset": dataset, "key": list(key)}

    def load(self) -> dict[str, Any]:
        """The index's entries (``{}`` when there is none or it cannot be trusted)."""
        try:
            st = os.stat(self.file)
            if st.st_uid != os.getuid():
                return {}  # not ours: never trusted
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = loaded_indexes.get(self.file)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            with open(self.file, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("ident") != self.ident:
                raise ValueError("another dataset's or version's index")
            entries = data["entries"]
            if not isinstance(entries, dict):
                raise ValueError("entries is not an object")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("discovery index %s unusable, rebuilt: %s", self.file, err)
            return {}
        loaded_indexes[self.file] = (stamp, entries)
        return entries

    def save(self, entries: dict[str, Any]) -> None:
        """Replace the index (best effort: a begin never fails because of its index)."""
        try:
            body = json.dumps({"ident": self.ident, "entries": entries}, separators=(",", ":"))
            st = write_whole(self.folder, self.file, body.encode("utf-8"))
            loaded_indexes[self.file] = ((st.st_ino, st.st_size, st.st_mtime_ns), entries)
        except OSError as err:
            log.debug("discovery index %s not written: %s", self.file, err)


# -- Parquet discovery: one small index file per partition -----------------------------------

_PARQUET_INDEX_VERSION = 2
_PREFETCH_REUSE_S = 60.0
"""The step under the lock reuses a prefetch of the same process at most this old."""
prefetched: dict[tuple[str, ...], tuple[float, dict[str, tuple[int, int]], dict[str, int]]] = {}
loaded_partitions: dict[str, tuple[tuple[int, int, int], ParquetPartition]] = {}


class StaleIndexError(Exception):
    """The index file was replaced after its first line was read: read it again, whole."""


class CorruptIndexError(Exception):
    """The index's table cannot be parsed: forget it (every footer is read again)."""


def take_prefetched(key: tuple[str, ...]) -> dict[str, int] | None:
    """What this process's last prefetch of the dataset found, if recent and no folder it
    looked at has changed since (else ``None``: look again). Used once."""
    entry = prefetched.pop(key, None)
    if entry is None:
        return None
    at, stamps, latest = entry
    if time.monotonic() - at > _PREFETCH_REUSE_S:
        return None
    for path, stamp in stamps.items():
        try:
            st = os.stat(path)
        except OSError:
            return None
        if (st.st_ino, st.st_mtime_ns) != stamp:
            return None
    return dict(latest)


def parquet_index_folder(index_dir: str | None, dataset: str, column: str) -> str:
    digest = hashlib.sha256(
        "\0".join(["parquet", os.path.realpath(dataset), column]).encode()
    ).hexdigest()[:32]
    return os.path.join(index_dir or default_index_dir(), f"parquet-{digest}")


def _partition_index_name(dirname: str) -> str:
    return hashlib.sha256(dirname.encode("utf-8", "surrogateescape")).hexdigest()[:24] + ".idx"


def prune_parquet_indexes(folder: str, present: set[str]) -> None:
    """Delete the indexes of partitions that are gone (one reappearing starts afresh)."""
    keep = {_partition_index_name(d) for d in present}
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(".idx") and name not in keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                loaded_partitions.pop(os.path.join(folder, name), None)


def _parent(rel_dir: str) -> str:
    """``"a/b/"`` -> ``"a/"``, ``"a/"`` -> ``""``."""
    return rel_dir[: rel_dir.rstrip("/").rfind("/") + 1]


class ParquetPartition:
    """What discovery knows of one partition folder: each folder of it (``""``, ``"sub/"``) as
    ``[inode, mtime_ns, listed_at_ns]`` (``listed_at`` 0: never trusted), one past the highest
    offset (``end``), the files holding it with ``[size, mtime_ns]`` (``newest``, looked at on
    every refresh), and each file's offset range (the table: ``names`` and ``spans``, aligned;
    read from the index only when needed)."""

    def __init__(
        self,
        dirs: dict[str, list[int]] | None = None,
        end: int = 0,
        newest: dict[str, list[int]] | None = None,
        count: int = 0,
        body: tuple[str, tuple[int, int, int], int] | None = None,
    ) -> None:
        self.dirs = dirs or {}
        self.end = end
        self.newest = newest or {}
        self.count = count
        self._body = body  # (index file, its stamp, offset of the table) while not loaded
        self._names: list[str] | None = None if body else []
        self._spans: list[str] | None = None if body else []
        self._groups: dict[str, set[str]] | None = None

    def copy(self) -> ParquetPartition:
        other = ParquetPartition(dict(self.dirs), self.end, dict(self.newest), self.count)
        other._body = self._body
        other._names = None if self._names is None else list(self._names)
        other._spans = None if self._spans is None else list(self._spans)
        return other

    # the table ----------------------------------------------------------------------------------

    def names(self) -> list[str]:
        if self._names is None:
            self._load_table()
        assert self._names is not None
        return self._names

    def _load_table(self) -> None:
        assert self._body is not None
        file, stamp, offset = self._body
        try:
            with open(file, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_ino, st.st_size, st.st_mtime_ns) != stamp:
                    raise StaleIndexError(file)
                f.seek(offset)
                text = f.read().decode("utf-8", "surrogateescape")
        except OSError as err:
            raise StaleIndexError(file) from err
        lines = text.split("\n")
        n = self.count
        if len(lines) != 2 * n + 1 or lines[-1] != "" or len(set(lines[:n])) != n:
            raise CorruptIndexError(f"{file}: table of {len(lines)} lines, {n} files")
        self._names, self._spans = lines[:n], lines[n : 2 * n]
        self._body = None

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each file (relative to the partition's folder) -> its lowest and highest offset."""
        names = self.names()
        assert self._spans is not None
        try:
            found = {}
            for name, span in zip(names, self._spans, strict=True):
                low, high = span.split(" ")
                found[name] = (int(low), int(high))
        except ValueError as err:
            raise CorruptIndexError(f"offset range {span!r}: {err}") from err
        return found

    def _known_in(self, rel_dir: str) -> set[str]:
        """Names (relative to the folder ``rel_dir``) of the files the table has in it."""
        names = self.names()
        if rel_dir == "" and not any(d for d in self.dirs):
            return set(names)  # no sub-folder: every file is right in the partition's folder
        if self._groups is None:
            groups: dict[str, set[str]] = {}
            for name in names:
                cut = name.rfind("/") + 1
                groups.setdefault(name[:cut], set()).add(name[cut:])
            self._groups = groups
        return self._groups.get(rel_dir, set())

    # looking at the folder -----------------------------------------------------------------------

    def refresh(self, root: str, column: str, stamps: dict[str, tuple[int, int]] | None) -> bool:
        """Bring this state up to date with the folder ``root``; ``True`` if it changed."""
        try:
            return self._refresh(root, column, stamps)
        except CorruptIndexError as err:
            log.warning("discovery index of %s unusable, rebuilt: %s", root, err)
            self.dirs, self.end, self.newest, self.count = {}, 0, {}, 0
            self._body, self._names, self._spans, self._groups = None, [], [], None
            return self._refresh(root, column, stamps) or True

    def _refresh(self, root: str, column: str, stamps: dict[str, tuple[int, int]] | None) -> bool:
        before = self.dirs
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
                old is not None
                and old[0] == st.st_ino
                and old[1] == st.st_mtime_ns
                and old[1] < old[2] - INDEX_MARGIN_NS
            ):
                visited[rel_dir] = old  # unchanged since a listing well after its last change
                pending += [d for d in before if d and _parent(d) == rel_dir]
                continue
            listed_at = time.time_ns()
            try:
                listed = set(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            replaced = old is not None and old[0] != st.st_ino
            known = set() if replaced else self._known_in(rel_dir)
            gone |= {rel_dir + name for name in known - listed}
            if replaced:
                gone |= {rel_dir + name for name in self._known_in(rel_dir)}
            trusted = True
            for name in listed - known:
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
            gone |= {rel_dir + name for name in self._known_in(rel_dir)}
        changed = visited != before
        self.dirs = visited
        storable = {rel: f for rel, f in fresh.items() if "\n" not in rel and "\r" not in rel}
        if gone or fresh:
            changed = True
            names, spans = self.names(), self._spans
            assert spans is not None
            if gone:  # (names found again in a replaced folder are in gone, and fresh)
                kept = [(n, s) for n, s in zip(names, spans, strict=True) if n not in gone]
                names, spans = [n for n, _ in kept], [s for _, s in kept]
            names += storable
            spans += [f"{f[2]} {f[3]}" for f in storable.values()]
            self._names, self._spans, self._groups = names, spans, None
            self.count = len(names)
        verified = {rel: [f[0], f[1]] for rel, f in fresh.items()}
        extra = {rel: f[3] for rel, f in fresh.items() if rel not in storable}
        if gone:
            newest = self._recompute(extra)
        else:
            top = max([self.end - 1, *(f[3] for f in fresh.values())])
            newest = [r for r in self.newest if self.end - 1 == top] + [
                r for r, f in fresh.items() if f[3] == top and r not in self.newest
            ]
            self.end = top + 1
            if top < 0:
                newest = []
        # The files holding the newest offsets (now, and at the previous look) are looked at
        # every time: one rewritten in place (against the contract) is read again, so a
        # partition that went back is reported.
        previous = [rel for rel in self.newest if rel not in gone]
        while True:
            todo = [rel for rel in [*newest, *previous] if rel not in verified]
            if not todo:
                break
            rel = todo[0]
            full = os.path.join(root, rel)
            try:
                fst = os.stat(full)
            except FileNotFoundError:
                self._drop({rel})
                extra.pop(rel, None)
                verified[rel] = [-1, -1]  # gone: looked at, not looked at again
                newest, changed = self._recompute(extra), True
                continue
            stamp = [fst.st_size, fst.st_mtime_ns]
            verified[rel] = stamp
            if rel in self.newest and self.newest[rel] != stamp:
                low, high = file_offsets(full, fst.st_mtime_ns, fst.st_size, column)
                log.warning(
                    "%s was rewritten in place (size or modification time changed): files must "
                    "not change once complete; offsets now [%s, %s]",
                    full,
                    low,
                    high,
                )
                self._drop({rel})
                names = self.names()
                assert self._spans is not None
                names.append(rel)
                self._spans.append(f"{low} {high}")
                self.count = len(names)
                newest, changed = self._recompute(extra), True
        newest_stamps = {rel: verified[rel] for rel in newest}
        if newest_stamps != self.newest:
            self.newest, changed = newest_stamps, True
        return changed

    def _drop(self, rels: set[str]) -> None:
        names = self.names()
        assert self._spans is not None
        kept = [(n, s) for n, s in zip(names, self._spans, strict=True) if n not in rels]
        self._names, self._spans = [n for n, _ in kept], [s for _, s in kept]
        self._groups, self.count = None, len(kept)

    def _recompute(self, extra: Mapping[str, int]) -> list[str]:
        """``end`` from the whole table (and ``extra`` files, not kept in it); the files holding
        the highest offset."""
        highs = {name: high for name, (_, high) in self.ranges().items()}
        highs.update(extra)
        top = max(highs.values(), default=-1)
        self.end = top + 1
        return [name for name, high in highs.items() if high == top] if top >= 0 else []


class ParquetPartitionIndex:
    """One partition's index file: its first line a small JSON head (what a begin needs), then
    the table (every file's name, then every file's offset range), read only when the folder
    changed or the Spark side selects a batch's files. Written whole (a temporary file, then
    ``os.replace``); unreadable, corrupt, foreign or not ours → empty (looked at again)."""

    def __init__(self, folder: str, dirname: str, dataset: str, column: str) -> None:
        self.folder = folder
        self.file = os.path.join(folder, _partition_index_name(dirname))
        self.ident = {
            "version": _PARQUET_INDEX_VERSION,
            "dataset": dataset,
            "column": column,
            "partition": dirname,
        }

    def load(self, *, table: bool = False) -> ParquetPartition:
        try:
            with open(self.file, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.getuid():
                    return ParquetPartition()  # not ours: never trusted
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                cached = loaded_partitions.get(self.file)
                if cached is not None and cached[0] == stamp:
                    part = cached[1].copy()
                else:
                    line = f.readline()
                    part = self._parse_head(json.loads(line), (self.file, stamp, len(line)))
                    loaded_partitions[self.file] = (stamp, part.copy())
            if table:
                part.ranges()
        except FileNotFoundError:
            return ParquetPartition()
        except (OSError, ValueError, KeyError, TypeError, CorruptIndexError) as err:
            log.warning("discovery index %s unusable, rebuilt: %s", self.file, err)
            return ParquetPartition()
        except StaleIndexError:
            return self.load(table=table)
        return part

    def _parse_head(
        self, head: Any, body: tuple[str, tuple[int, int, int], int]
    ) -> ParquetPartition:
        def ints(value: Any, n: int) -> bool:
            return type(value) is list and len(value) == n and all(type(v) is int for v in value)

        if not isinstance(head, dict) or head.get("ident") != self.ident:
            raise ValueError("another dataset's or version's index")
        dirs, end, newest, count = head["dirs"], head["end"], head["newest"], head["n"]
        if not (
            isinstance(dirs, dict)
            and all(ints(v, 3) for v in dirs.values())
            and isinstance(newest, dict)
            and all(ints(v, 2) for v in newest.values())
            and type(end) is int
            and end >= 0
            and type(count) is int
            and count >= 0
        ):
            raise ValueError("malformed head")
        return ParquetPartition(dirs, end, newest, count, body)

    def save(self, part: ParquetPartition) -> None:
        """Replace the index (best effort: a begin never fails because of its index)."""
        try:
            names = part.names()
            spans = part._spans
            assert spans is not None
            head = {
                "ident": self.ident,
                "dirs": part.dirs,
                "end": part.end,
                "newest": part.newest,
                "n": len(names),
            }
            lines = [json.dumps(head, separators=(",", ":")), *names, *spans]
            text = "\n".join(lines) + "\n"
            os.makedirs(os.path.dirname(self.folder), mode=0o700, exist_ok=True)  # private
            st = write_whole(self.folder, self.file, text.encode("utf-8", "surrogateescape"))
            saved = part.copy()
            loaded_partitions[self.file] = ((st.st_ino, st.st_size, st.st_mtime_ns), saved)
        except (OSError, UnicodeError, StaleIndexError, CorruptIndexError) as err:
            log.debug("discovery index %s not written: %s", self.file, err)
