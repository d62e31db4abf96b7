"""The discovery index of a Parquet dataset: one append-only file per partition.

A file holds a base (a JSON head line, then every file's name, then every file's offset range),
followed by one JSON line per later change (the new head, the names added and dropped). A begin
reads the first and the last line only; the table (base plus changes) is read when a folder
must be listed or the Spark side selects a batch's files. A change is appended (``O_APPEND``,
under ``flock``, only if nobody appended since this state was read); the file is written whole
(a temporary file, then ``os.replace``) when new, after a corrupt tail, or once the appended
changes outgrow a fraction of the base (compaction). See docs/sources.md, "How the built-in
sources find new data".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from airflow_txn_provider.sources.file_index import default_index_dir, write_whole

log = logging.getLogger(__name__)

_VERSION = 3
COMPACT_FRACTION = 0.5
"""The file is rewritten whole once its appended changes pass this fraction of its base..."""
COMPACT_MIN_BYTES = 64 * 1024
"""...and this size: reading the table then costs at most about 1.5x the base."""
loaded_partitions: dict[str, tuple[tuple[int, int, int], ParquetPartition]] = {}


class StaleIndexError(Exception):
    """The index file was replaced after its head was read: read it again, whole."""


class CorruptIndexError(Exception):
    """The index's table cannot be parsed: forget it (every footer is read again)."""


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


class ParquetPartition:
    """What discovery knows of one partition folder: each folder of it (``""``, ``"sub/"``) as
    ``[inode, mtime_ns, listed_at_ns]`` (``listed_at`` 0: never trusted), one past the highest
    offset (``end``), the files holding it with ``[size, mtime_ns]`` (``newest``, looked at on
    every refresh), and the table: each file (relative to the folder) -> ``"low high"``, read
    from the index only when needed. ``added`` and ``dropped`` are the table's changes since
    the index was read (what an append writes)."""

    def __init__(
        self,
        dirs: dict[str, list[int]] | None = None,
        end: int = 0,
        newest: dict[str, list[int]] | None = None,
        reader: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.dirs = dirs or {}
        self.end = end
        self.newest = newest or {}
        self._reader = reader
        self._table: dict[str, str] | None = None if reader else {}
        self._groups: dict[str, set[str]] | None = None
        self.added: dict[str, str] = {}
        self.dropped: set[str] = set()
        self.at: tuple[int, int, int] | None = None  # the index file's stamp when read
        self.base_bytes = 0
        self.tail_bytes = 0
        self.rewrite = reader is None  # no index file yet (or one to replace): write it whole
        self.layout = (0, 0)  # the index file's head line length and base files

    def copy(self) -> ParquetPartition:
        other = ParquetPartition(dict(self.dirs), self.end, dict(self.newest))
        other.__dict__.update(
            {k: v for k, v in self.__dict__.items() if k not in ("dirs", "newest")}
        )
        other._table = None if self._table is None else dict(self._table)
        other._groups = None
        other.added, other.dropped = dict(self.added), set(self.dropped)
        return other

    def reset(self) -> None:
        """Forget everything (a corrupt table): every file is looked at again."""
        self.__init__()  # type: ignore[misc]

    # the table ----------------------------------------------------------------------------------

    def table(self) -> dict[str, str]:
        if self._table is None:
            assert self._reader is not None
            table = self._reader()
            for name in self.dropped:
                table.pop(name, None)
            table.update(self.added)
            self._table = table
        return self._table

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each file (relative to the partition's folder) -> its lowest and highest offset."""
        found = {}
        try:
            for name, span in self.table().items():
                low, high = span.split(" ")
                found[name] = (int(low), int(high))
        except ValueError as err:
            raise CorruptIndexError(f"offset range {span!r}: {err}") from err
        return found

    def known_in(self, rel_dir: str) -> Any:
        """Names (relative to the folder ``rel_dir``) of the files the table has in it."""
        table = self.table()
        if rel_dir == "" and not any(d for d in self.dirs):
            return table.keys()  # no sub-folder: every file is right in the partition's folder
        if self._groups is None:
            groups: dict[str, set[str]] = {}
            for name in table:
                cut = name.rfind("/") + 1
                groups.setdefault(name[:cut], set()).add(name[cut:])
            self._groups = groups
        return self._groups.get(rel_dir, set())

    def add(self, rel: str, low: int, high: int) -> None:
        span = f"{low} {high}"
        self.added[rel] = span
        if self._table is not None:
            self._table[rel] = span
        self._groups = None

    def drop(self, rels: set[str]) -> None:
        for rel in rels:
            self.added.pop(rel, None)
            self.dropped.add(rel)
            if self._table is not None:
                self._table.pop(rel, None)
        self._groups = None


def _ints(value: Any, n: int) -> bool:
    return type(value) is list and len(value) == n and all(type(v) is int for v in value)


def _check_state(head: Any) -> None:
    if not isinstance(head, dict):
        raise ValueError("not an object")
    dirs, end, newest = head["dirs"], head["end"], head["newest"]
    if not (
        isinstance(dirs, dict)
        and all(_ints(v, 3) for v in dirs.values())
        and isinstance(newest, dict)
        and all(_ints(v, 2) for v in newest.values())
        and type(end) is int
        and end >= 0
    ):
        raise ValueError("malformed head")


def _check_change(change: Any) -> None:
    _check_state(change)
    added, dropped = change["add"], change["drop"]
    if not (
        isinstance(added, dict)
        and all(isinstance(v, str) for v in added.values())
        and isinstance(dropped, list)
        and all(isinstance(v, str) for v in dropped)
    ):
        raise ValueError("malformed change")


def _last_line(f: Any, start: int, size: int) -> bytes | None:
    """The last line of ``f`` at or after ``start`` (``None``: the file ends mid-line)."""
    pos, chunk, buf = size, 4096, b""
    while True:
        begin = max(start, pos - chunk)
        f.seek(begin)
        buf = f.read(pos - begin) + buf
        pos = begin
        if not buf.endswith(b"\n"):
            return None
        cut = buf.rfind(b"\n", 0, len(buf) - 1)
        if cut >= 0:
            return buf[cut + 1 :]
        if begin == start:
            return buf
        chunk *= 4


class ParquetPartitionIndex:
    """One partition's index file (the module's docstring). Unreadable, corrupt, foreign or not
    ours → empty (every file looked at again); a corrupt last change → the state before it, and
    the file is written whole at the next save."""

    def __init__(self, folder: str, dirname: str, dataset: str, column: str) -> None:
        self.folder = folder
        self.file = os.path.join(folder, _partition_index_name(dirname))
        self.ident = {
            "version": _VERSION,
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
                    part = self._read(f, stamp)
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

    def _read(self, f: Any, stamp: tuple[int, int, int]) -> ParquetPartition:
        first = f.readline()
        head = json.loads(first)
        if not isinstance(head, dict) or head.get("ident") != self.ident:
            raise ValueError("another dataset's or version's index")
        _check_state(head)
        n, table_bytes = head["n"], head["table_bytes"]
        if not (type(n) is int and n >= 0 and type(table_bytes) is int and table_bytes >= 0):
            raise ValueError("malformed head")
        base = len(first) + table_bytes
        size = stamp[1]
        if base > size:
            raise ValueError("shorter than its table")
        current = head
        if size > base:
            last = _last_line(f, base, size)
            try:
                if last is None:
                    raise ValueError("ends mid-line")
                current = json.loads(last)
                _check_change(current)
            except (ValueError, KeyError, TypeError) as err:  # a writer died mid-append
                log.warning("discovery index %s: last change unusable, ignored: %s", self.file, err)
                return self._read_repaired(stamp, head, len(first), base)
        part = ParquetPartition(
            current["dirs"], current["end"], current["newest"], self._reader(stamp, len(first), n)
        )
        part.at, part.base_bytes, part.tail_bytes, part.rewrite = stamp, base, size - base, False
        part.layout = (len(first), n)
        return part

    def _reader(self, stamp: tuple[int, int, int], offset: int, n: int) -> Callable[[], dict]:
        return lambda: self._read_table(stamp, offset, n)[0]

    def _read_table(
        self, stamp: tuple[int, int, int], offset: int, n: int, *, tolerant: bool = False
    ) -> tuple[dict[str, str], dict[str, Any] | None]:
        """The base table and every change after it applied, as of ``stamp`` (the file grows
        only by appends: what was there is still there while its inode is the same); with
        ``tolerant``, changes from the first unusable one on are ignored and the last usable
        change is returned too."""
        try:
            with open(self.file, "rb") as f:
                if os.fstat(f.fileno()).st_ino != stamp[0]:
                    raise StaleIndexError(self.file)
                f.seek(offset)
                text = f.read(stamp[1] - offset).decode("utf-8", "surrogateescape")
        except OSError as err:
            raise StaleIndexError(self.file) from err
        lines = text.split("\n")
        table = dict(zip(lines[:n], lines[n : 2 * n], strict=False))
        if len(lines) < 2 * n + 1 or len(table) != n:
            raise CorruptIndexError(f"{self.file}: table of {len(lines)} lines, {n} files")
        last = None
        for line in lines[2 * n : -1]:
            try:
                change = json.loads(line)
                _check_change(change)
            except (ValueError, KeyError, TypeError) as err:
                if tolerant:
                    break
                raise CorruptIndexError(f"{self.file}: change {line[:80]!r}: {err}") from err
            for name in change["drop"]:
                table.pop(name, None)
            table.update(change["add"])
            last = change
        return table, last

    def _read_repaired(
        self, stamp: tuple[int, int, int], head: dict[str, Any], offset: int, base: int
    ) -> ParquetPartition:
        table, last = self._read_table(stamp, offset, head["n"], tolerant=True)
        current = last or head
        part = ParquetPartition(current["dirs"], current["end"], current["newest"])
        part._table, part.at, part.base_bytes, part.rewrite = table, stamp, base, True
        return part

    # writing ------------------------------------------------------------------------------------

    def _change(self, part: ParquetPartition) -> bytes:
        change = {
            "dirs": part.dirs,
            "end": part.end,
            "newest": part.newest,
            "add": part.added,
            "drop": sorted(part.dropped),
        }
        return (json.dumps(change, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")

    def compaction_due(self, part: ParquetPartition) -> bool:
        """Would :meth:`save` write the file whole (it then reads the whole table)?"""
        if part.rewrite or part.at is None:
            return True
        grown = part.tail_bytes + len(self._change(part))
        return grown > max(COMPACT_MIN_BYTES, COMPACT_FRACTION * part.base_bytes)

    def save(self, part: ParquetPartition) -> None:
        """Write ``part``'s changes (best effort: a begin never fails because of its index).
        ``part`` then stands for the file as written."""
        try:
            if self.compaction_due(part):
                self._write_whole(part)
            else:
                self._append(part)
        except (OSError, UnicodeError, StaleIndexError, CorruptIndexError) as err:
            log.debug("discovery index %s not written: %s", self.file, err)

    def _write_whole(self, part: ParquetPartition) -> None:
        table = part.table()
        head = {"ident": self.ident, "dirs": part.dirs, "end": part.end, "newest": part.newest}
        body = "".join(f"{name}\n" for name in table) + "".join(f"{s}\n" for s in table.values())
        data = body.encode("utf-8", "surrogateescape")
        head.update(n=len(table), table_bytes=len(data))
        first = (json.dumps(head, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
        os.makedirs(os.path.dirname(self.folder), mode=0o700, exist_ok=True)  # private
        st = write_whole(self.folder, self.file, first + data)
        part.layout = (len(first), len(table))
        self._saved(part, (st.st_ino, st.st_size, st.st_mtime_ns), len(first) + len(data), 0)

    def _append(self, part: ParquetPartition) -> None:
        assert part.at is not None
        data = self._change(part)
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process is writing its own (also right) change: keep it
            except OSError:  # no flock here (some network file systems): never append
                self._write_whole(part)
                return
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) != part.at[:2] or os.stat(self.file).st_ino != st.st_ino:
                return  # changed (or replaced) since read: that version stands
            written = os.write(fd, data)
            if written != len(data):  # (a full disk): take the half line back
                os.ftruncate(fd, st.st_size)
                return
            st = os.fstat(fd)
        finally:
            os.close(fd)  # (releases the lock)
        tail = part.tail_bytes + len(data)
        self._saved(part, (st.st_ino, st.st_size, st.st_mtime_ns), part.base_bytes, tail)

    def _saved(
        self, part: ParquetPartition, stamp: tuple[int, int, int], base: int, tail: int
    ) -> None:
        if part._table is None:  # read from the new version when needed (it has the changes)
            part._reader = self._reader(stamp, *part.layout)
        part.added, part.dropped = {}, set()
        part.at, part.base_bytes, part.tail_bytes, part.rewrite = stamp, base, tail, False
        loaded_partitions[self.file] = (stamp, part.copy())
