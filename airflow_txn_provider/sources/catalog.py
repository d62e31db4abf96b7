"""What a file source's discovery knows, kept where every host sees it: the log's Postgres.

Per partition: its folders' stamps at their last listing, one past its highest offset and the
files holding that offset; per file: its size, modification time and offset range. A begin on
any machine then lists only folders changed since some begin listed them and reads only new
files' footers; a job finds its batch's files by their offset ranges. Every entry is checked
against a ``stat`` before it is trusted, so a stale write is harmless and any writer's is right.
A source used without a log (a notebook, a unit test) keeps it in its own memory.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

MARGIN_NS = 2_000_000_000
"""A folder modified less than this before it was listed may change again within its timestamp
tick, unseen: such a listing is used once, never trusted (:func:`trusted`)."""

Folder = tuple[int, int, int]
"""A folder's ``(inode, mtime_ns, listed_at_ns)`` at its last listing."""
FileFacts = tuple[int, int, int, int]
"""A file's ``(size, mtime_ns, first_offset, last_offset)``."""


def trusted(known: Folder | None, inode: int, mtime_ns: int) -> bool:
    """Whether a folder now at ``(inode, mtime_ns)`` holds what its listing ``known`` found."""
    return known is not None and known[:2] == (inode, mtime_ns) and mtime_ns < known[2] - MARGIN_NS


@dataclasses.dataclass
class Partition:
    """One partition as the catalog knows it."""

    folders: dict[str, Folder] = dataclasses.field(default_factory=dict)
    """Each folder of the partition (``""``, ``"sub/"``) at its last listing."""
    end: int = 0
    """One past the highest offset of its files (0: none)."""
    newest: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """The files holding ``end - 1``: name -> ``(size, mtime_ns)``."""


@dataclasses.dataclass
class Look:
    """What one look at a partition found, to record."""

    folders: dict[str, Folder]
    """Its folders now."""
    added: dict[str, FileFacts] = dataclasses.field(default_factory=dict)
    """Files found (or read again): name -> facts."""
    dropped: set[str] = dataclasses.field(default_factory=set)
    """Files gone."""
    after: Partition | None = None
    """The partition after the look, when the look knows it (files probed past the end);
    ``None``: its end and newest are taken from its files as recorded (after a listing)."""


class FileCatalog(ABC):
    """Where discovery keeps what it found, by source (a key naming the dataset) and partition."""

    @abstractmethod
    def partitions(self, source: str) -> dict[str, Partition]:
        """Every partition known of ``source``."""

    @abstractmethod
    def names(
        self, source: str, partition: str, folder: str = "", *, direct: bool = False
    ) -> set[str]:
        """The names (relative to the partition's folder) of its known files under ``folder``
        (``""``, ``"sub/"``); with ``direct``, right in it only."""

    @abstractmethod
    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        """The known files holding an offset in ``[start, end)``: name -> ``(first, last)``."""

    @abstractmethod
    def record_all(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        """Store looks at partitions (value -> look), in one transaction. Returns each
        partition after its look."""

    def record(
        self,
        source: str,
        partition: str,
        folders: Mapping[str, Folder],
        added: Mapping[str, FileFacts],
        dropped: Iterable[str],
    ) -> Partition:
        """Store one look at a partition (:meth:`record_all`); its end and newest from its
        files."""
        look = Look(dict(folders), dict(added), set(dropped))
        return self.record_all(source, {partition: look})[partition]

    @abstractmethod
    def forget(self, source: str, partitions: Iterable[str]) -> None:
        """Drop what is known of partitions that are gone."""


class MemoryCatalog(FileCatalog):
    """A catalog in this process's memory: for a source used without a transaction log."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, str], Partition] = {}
        self._files: dict[tuple[str, str], dict[str, FileFacts]] = {}

    def partitions(self, source: str) -> dict[str, Partition]:
        return {p: copy.deepcopy(part) for (s, p), part in self._parts.items() if s == source}

    def names(self, source, partition, folder="", *, direct=False):  # type: ignore[no-untyped-def]
        return {
            name
            for name in self._files.get((source, partition), {})
            if name.startswith(folder) and not (direct and "/" in name[len(folder) :])
        }

    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        files = self._files.get((source, partition), {})
        return {n: (f[2], f[3]) for n, f in files.items() if f[3] >= start and f[2] < end}

    def record_all(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        found = {}
        for partition, look in looks.items():
            files = self._files.setdefault((source, partition), {})
            for name in look.dropped:
                files.pop(name, None)
            files.update(look.added)
            part = look.after
            if part is None:
                top = max((f[3] for f in files.values()), default=-1)
                newest = {n: (f[0], f[1]) for n, f in files.items() if f[3] == top and top >= 0}
                part = Partition(dict(look.folders), top + 1, newest)
            self._parts[(source, partition)] = part
            found[partition] = copy.deepcopy(part)
        return found

    def forget(self, source: str, partitions: Iterable[str]) -> None:
        for p in partitions:
            self._parts.pop((source, p), None)
            self._files.pop((source, p), None)


class PostgresCatalog(FileCatalog):
    """The catalog in the transaction log's Postgres (``txn_source_partition``,
    ``txn_source_file``), shared by every host. Plain SQL on the driver's cursor: a begin runs
    in a new process, where building SQLAlchemy statements and rows costs more than the round
    trips, and a listing reads a partition's names (100 000 at times) in one fetch. A look is
    recorded in one transaction of a few set-based statements."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _rows(self, sql: str, params: Mapping[str, Any], *, binary: bool = False) -> list[Any]:
        with self.engine.connect() as conn:
            cursor = conn.connection.cursor(binary=binary)
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def partitions(self, source: str) -> dict[str, Partition]:
        sql = (
            "SELECT partition, folders, end_offset, newest FROM txn_source_partition"
            " WHERE source = %(s)s"
        )
        return {
            partition: Partition(
                {k: tuple(v) for k, v in folders.items()},  # type: ignore[misc]
                end,
                {k: tuple(v) for k, v in newest.items()},  # type: ignore[misc]
            )
            for partition, folders, end, newest in self._rows(sql, {"s": source})
        }

    def names(self, source, partition, folder="", *, direct=False):  # type: ignore[no-untyped-def]
        sql = (
            "SELECT coalesce(array_agg(name), '{}') FROM txn_source_file WHERE source = %(s)s"
            " AND partition = %(p)s AND left(name, %(n)s) = %(f)s"
        )
        if direct:
            sql += " AND strpos(substr(name, %(n)s + 1), '/') = 0"
        params = {"s": source, "p": partition, "f": folder, "n": len(folder)}
        # One array, in binary: one value to fetch, and no array text to parse.
        return set(self._rows(sql, params, binary=True)[0][0])

    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        sql = (
            "SELECT name, first_offset, last_offset FROM txn_source_file WHERE source = %(s)s"
            " AND partition = %(p)s AND last_offset >= %(start)s AND first_offset < %(end)s"
        )
        params = {"s": source, "p": partition, "start": start, "end": end}
        return {name: (first, last) for name, first, last in self._rows(sql, params)}

    def record_all(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        ordered = sorted(looks.items())
        gone = [(p, n) for p, look in ordered for n in sorted(look.dropped - set(look.added))]
        added = [(p, n, *f) for p, look in ordered for n, f in sorted(look.added.items())]
        found = {p: look.after for p, look in ordered if look.after is not None}
        lock = zlib.crc32(source.encode("utf-8", "surrogatepass")) - 2**31
        with self.engine.begin() as conn:
            cursor = conn.connection.cursor()
            # What a look found can be found again: a crash may lose it, never a txid's batch.
            # One look at a source records at a time: each then reads the files the one before
            # it committed (no end computed from half of them), and no two cross their deletes.
            cursor.execute(
                "SET LOCAL synchronous_commit TO OFF;"
                f" SELECT pg_advisory_xact_lock({_LOCK_CLASS}, {lock})"
            )
            if gone:
                cursor.execute(_DELETE_FILES, {"s": source, **_columns(gone, "p", "n")})
            if added:
                columns = _columns(added, "p", "n", "size", "mtime", "first", "last")
                cursor.execute(_UPSERT_FILES, {"s": source, **columns})
            asked = [p for p, _ in ordered if p not in found]
            if asked:
                found |= {p: Partition(dict(looks[p].folders)) for p in asked}
                cursor.execute(_NEWEST_FILES, {"s": source, "ps": asked})
                for partition, name, size, mtime_ns, last in cursor.fetchall():
                    part = found[partition]
                    part.end = last + 1
                    part.newest[name] = (size, mtime_ns)
            rows = [
                (p, json.dumps(part.folders), part.end, json.dumps(part.newest))
                for p, part in sorted(found.items())
            ]
            cursor.execute(_UPSERT_PARTITIONS, {"s": source, **_columns(rows, *"pfen")})
        return found

    def forget(self, source: str, partitions: Iterable[str]) -> None:
        gone = sorted(partitions)
        if not gone:
            return
        with self.engine.begin() as conn:
            cursor = conn.connection.cursor()
            for table in ("txn_source_file", "txn_source_partition"):
                cursor.execute(
                    f"DELETE FROM {table} WHERE source = %(s)s AND partition = ANY(%(ps)s)",
                    {"s": source, "ps": gone},
                )


_LOCK_CLASS = 0x7478_6E46  # "txnF": the first key of the catalog's advisory locks, one per source


def _columns(rows: list[tuple[Any, ...]], *names: str) -> dict[str, list[Any]]:
    """Rows as one list per column, named: what ``unnest`` takes."""
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


_DELETE_FILES = (
    "DELETE FROM txn_source_file f USING unnest(%(p)s::text[], %(n)s::text[])"
    " AS g(partition, name) WHERE f.source = %(s)s AND f.partition = g.partition"
    " AND f.name = g.name"
)
_UPSERT_FILES = (
    "INSERT INTO txn_source_file"
    " (source, partition, name, size, mtime_ns, first_offset, last_offset)"
    " SELECT %(s)s, * FROM unnest(%(p)s::text[], %(n)s::text[], %(size)s::bigint[],"
    " %(mtime)s::bigint[], %(first)s::bigint[], %(last)s::bigint[])"
    " ON CONFLICT (source, partition, name) DO UPDATE SET"
    " size = excluded.size, mtime_ns = excluded.mtime_ns,"
    " first_offset = excluded.first_offset, last_offset = excluded.last_offset"
)
_NEWEST_FILES = (
    "SELECT p.partition, f.name, f.size, f.mtime_ns, f.last_offset"
    " FROM unnest(%(ps)s::text[]) AS p(partition) CROSS JOIN LATERAL ("
    " SELECT name, size, mtime_ns, last_offset FROM txn_source_file"
    " WHERE source = %(s)s AND partition = p.partition AND last_offset >= 0 AND last_offset = ("
    " SELECT max(last_offset) FROM txn_source_file WHERE source = %(s)s"
    " AND partition = p.partition) OFFSET 0) AS f"
)
"""Each partition's files holding its highest offset: per partition, the index's last entry
(``OFFSET 0`` keeps the per-partition look-up from being turned into a join the planner may
order wrongly while a new dataset's rows are not in the statistics yet)."""
_UPSERT_PARTITIONS = (
    "INSERT INTO txn_source_partition (source, partition, folders, end_offset, newest)"
    " SELECT %(s)s, * FROM unnest(%(p)s::text[], %(f)s::jsonb[], %(e)s::bigint[],"
    " %(n)s::jsonb[]) ON CONFLICT (source, partition) DO UPDATE"
    " SET folders = excluded.folders, end_offset = excluded.end_offset,"
    " newest = excluded.newest"
)


S = TypeVar("S", bound="UsesCatalog")


class UsesCatalog:
    """A source whose discovery keeps what it found in a :class:`FileCatalog`: its own memory
    until :func:`with_log_catalog` gives it the log's (a copy, for one begin or one job)."""

    def catalog_key(self) -> str:
        """The key of this source's dataset in the catalog (the same on every host)."""
        raise NotImplementedError

    @property
    def catalog(self) -> FileCatalog:
        found = self.__dict__.get("_catalog")
        if found is None:
            found = MemoryCatalog()
            object.__setattr__(self, "_catalog", found)  # (sources are frozen dataclasses)
        return found

    def with_catalog(self: S, catalog: FileCatalog) -> S:
        bound = copy.copy(self)
        bound.__dict__.pop("_prefetched", None)
        object.__setattr__(bound, "_catalog", catalog)
        return bound


def with_log_catalog(source: Any, engine: Engine) -> Any:
    """``source``, if it keeps a catalog, as a copy keeping it in the log's Postgres."""
    if isinstance(source, UsesCatalog):
        return source.with_catalog(PostgresCatalog(engine))
    return source
