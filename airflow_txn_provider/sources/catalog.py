"""What a file source's discovery found, kept where every host sees it: the log's Postgres. Every
entry is checked against a ``stat`` before it is trusted, so a stale write is harmless."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

NAME_SEGMENTS = 32
"""A partition's names kept in this many values are written as one (``_RECORD_PARTITIONS``)."""
ANALYZE_AFTER = 10_000
"""A look adding this many files has the catalog's tables analysed at once (not a minute later by
autovacuum): until then the planner takes the dataset for a few rows and scans all of them."""
MARGIN_NS = 2_000_000_000
"""A listing less than this after its folder's last change is never trusted (same time tick)."""

Folder = tuple[int, int, int]  # a folder's (inode, mtime_ns, listed_at_ns) at its last listing
FileFacts = tuple[int, int, int, int]  # a file's (size, mtime_ns, first, last offset); -1: none


def trusted(known: Folder | None, inode: int, mtime_ns: int) -> TypeGuard[Folder]:
    """Whether a folder now at ``(inode, mtime_ns)`` holds what its listing ``known`` found."""
    return known is not None and known[:2] == (inode, mtime_ns) and mtime_ns < known[2] - MARGIN_NS


def listing_holds(known: Partition | None, st: os.stat_result) -> TypeGuard[Partition]:
    """Whether a partition's folder, now at ``st``, holds what ``known``'s listing of it found."""
    return known is not None and trusted(known.folders.get(""), st.st_ino, st.st_mtime_ns)


@dataclasses.dataclass
class Partition:
    """A partition as the catalog knows it: its folders (``""``, ``"sub/"``) at their last listing,
    one past its highest offset (0: none), the files holding that offset (-> size, mtime_ns)."""

    folders: dict[str, Folder] = dataclasses.field(default_factory=dict)
    end: int = 0
    newest: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Look:
    """A look at a partition: its folders now, files found (or read again), files gone."""

    folders: dict[str, Folder]
    added: dict[str, FileFacts] = dataclasses.field(default_factory=dict)
    dropped: set[str] = dataclasses.field(default_factory=set)


class FileCatalog(Protocol):
    """What discovery found, by source (a key naming the dataset) and partition."""

    def partitions(self, source: str) -> dict[str, Partition]:
        """Every partition known of ``source``."""

    def names(self, source: str, partitions: Iterable[str]) -> dict[str, list[str]]:
        """The names of each partition's files (relative to its folder: ``"sub/a.parquet"``)."""

    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        """The files holding an offset in ``[start, end)``: name -> ``(first, last)``."""

    def record(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        """Store looks at partitions (value -> look) at once: each partition after its look."""

    def forget(self, source: str, partitions: Iterable[str]) -> None:
        """Drop what is known of partitions that are gone."""


class MemoryCatalog(FileCatalog):
    """A catalog in this process's memory: for a source used without a transaction log."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], Partition] = {}
        self._files: dict[tuple[str, str], dict[str, FileFacts]] = {}

    def partitions(self, source: str) -> dict[str, Partition]:
        return {p: copy.deepcopy(part) for (s, p), part in self._known.items() if s == source}

    def names(self, source: str, partitions: Iterable[str]) -> dict[str, list[str]]:
        return {p: list(self._files.get((source, p), {})) for p in partitions}

    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        files = self._files.get((source, partition), {})
        return {n: (f[2], f[3]) for n, f in files.items() if f[3] >= start and f[2] < end}

    def record(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        for p, look in looks.items():
            old = self._files.get((source, p), {})
            files = {n: f for n, f in old.items() if n not in look.dropped} | look.added
            top = max((f[3] for f in files.values()), default=-1)
            newest = {n: f[:2] for n, f in files.items() if f[3] == top >= 0}
            self._known[source, p] = Partition(dict(look.folders), top + 1, newest)
            self._files[source, p] = files
        return {p: copy.deepcopy(self._known[source, p]) for p in looks}

    def forget(self, source: str, partitions: Iterable[str]) -> None:
        for p in partitions:
            self._known.pop((source, p), None)
            self._files.pop((source, p), None)


class PostgresCatalog(FileCatalog):
    """The catalog in the log's Postgres (``txn_source_partition``, ``txn_source_file``,
    ``txn_source_names``). Plain SQL on the driver's cursor: in a begin's new process, SQLAlchemy
    costs more than round trips."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _rows(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:  # binary: no array or number text to parse
            return conn.connection.cursor(binary=True).execute(sql, params).fetchall()

    def partitions(self, source: str) -> dict[str, Partition]:
        sql = (
            "SELECT partition, folders, end_offset, newest FROM txn_source_partition"
            " WHERE source = %(s)s"
        )
        return dict(_partition(*row) for row in self._rows(sql, s=source))

    def names(self, source: str, partitions: Iterable[str]) -> dict[str, list[str]]:
        sql = (  # a few values per partition, not a row per file; all in one round trip
            "SELECT partition, names FROM txn_source_names WHERE source = %(s)s"
            " AND partition = ANY(%(ps)s::text[])"
        )
        segments: dict[str, list[str]] = {p: [] for p in partitions}
        for partition, names in self._rows(sql, s=source, ps=list(segments)):
            segments[partition].append(names)
        return {p: "\n".join(texts).split("\n") if texts else [] for p, texts in segments.items()}

    def meeting(self, source: str, partition: str, start: int, end: int) -> dict[str, Any]:
        sql = (
            "SELECT name, first_offset, last_offset FROM txn_source_file WHERE source = %(s)s"
            " AND partition = %(p)s AND last_offset >= %(start)s AND first_offset < %(end)s"
        )
        rows = self._rows(sql, s=source, p=partition, start=start, end=end)
        return {name: (first, last) for name, first, last in rows}

    def record(self, source: str, looks: Mapping[str, Look]) -> dict[str, Partition]:
        ordered = sorted(looks.items())  # rows in one order: concurrent looks never deadlock
        gone = [(p, n) for p, look in ordered for n in sorted(look.dropped - set(look.added))]
        added = [(p, n, *f) for p, look in ordered for n, f in sorted(look.added.items())]
        folders = [(p, json.dumps(look.folders)) for p, look in ordered]
        params = _columns(gone, "gp", "gn") | _columns(folders, "fp", "f") | {"s": source}
        params |= _columns(added, "p", "n", "size", "mtime", "first", "last")
        lock = zlib.crc32(source.encode("utf-8", "surrogatepass")) - 2**31
        with self.engine.begin() as conn:
            cursor = conn.connection.cursor()
            # A crash may lose a look (the next begin makes it again), never a txid's batch. One
            # look at a source at a time: each reads the files the one before it committed.
            cursor.execute(
                "SET LOCAL synchronous_commit TO OFF;"
                f" SELECT pg_advisory_xact_lock({_LOCK_CLASS}, {lock})"
            )
            cursor.execute(_RECORD_FILES, params)
            fresh, dropped = dict(cursor.fetchall()), set(params["gp"])  # names gained, lost
            params |= {"new": [fresh.get(p) for p in params["fp"]]}
            params |= {"gone": [p in dropped for p in params["fp"]]}
            cursor.execute(_RECORD_PARTITIONS, params | {"most": NAME_SEGMENTS})
            found = dict(_partition(*row) for row in cursor.fetchall())
            if len(added) >= ANALYZE_AFTER:  # the next looks planned for these rows, not without
                cursor.execute("ANALYZE txn_source_file, txn_source_names")
            return found

    def forget(self, source: str, partitions: Iterable[str]) -> None:
        with self.engine.begin() as conn:
            conn.connection.cursor().execute(_FORGET, {"s": source, "ps": sorted(partitions)})


_LOCK_CLASS = 0x7478_6E46  # "txnF": the first key of the catalog's advisory locks, one per source


def _columns(rows: list[tuple[Any, ...]], *names: str) -> dict[str, list[Any]]:
    """Rows as one list per column, named: what ``unnest`` takes."""
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def _partition(name: str, folders: Any, end: int, newest: Any) -> tuple[str, Partition]:
    """A ``txn_source_partition`` row as a partition (its JSON lists as tuples)."""
    folders, newest = ({k: tuple(v) for k, v in d.items()} for d in (folders, newest))
    return name, Partition(folders, end, newest)


# The files dropped and added; returned: the added names not known before (one snapshot: the
# statement's own writes unseen), by partition.
_RECORD_FILES = (
    "WITH gone AS (DELETE FROM txn_source_file f USING unnest(%(gp)s::text[], %(gn)s::text[])"
    " AS g(partition, name) WHERE f.source = %(s)s AND f.partition = g.partition"
    " AND f.name = g.name), added AS (SELECT * FROM unnest(%(p)s::text[], %(n)s::text[],"
    " %(size)s::bigint[], %(mtime)s::bigint[], %(first)s::bigint[], %(last)s::bigint[])"
    " AS a(partition, name, size, mtime_ns, first_offset, last_offset)), put AS ("
    " INSERT INTO txn_source_file SELECT %(s)s, * FROM added"
    " ON CONFLICT (source, partition, name) DO UPDATE SET size = excluded.size,"
    " mtime_ns = excluded.mtime_ns, first_offset = excluded.first_offset,"
    " last_offset = excluded.last_offset) SELECT partition, string_agg(name, E'\\n') FROM added a"
    " WHERE NOT EXISTS (SELECT FROM txn_source_file f WHERE f.source = %(s)s"
    " AND f.partition = a.partition AND f.name = a.name) GROUP BY partition"
)
# Each partition with its files' highest offset and the files holding it, looked up by itself
# (OFFSET 0: not a join, which the planner may order wrongly for a new dataset). Its new names
# as its next segment of names; at ``most`` segments, all of them and the new names as one (read
# from its files when some went): a listing reads a few values, a look writes what it found.
_RECORD_PARTITIONS = (
    "WITH l AS (SELECT * FROM unnest(%(fp)s::text[], %(f)s::jsonb[], %(new)s::text[],"
    " %(gone)s::boolean[]) AS l(partition, folders, new, gone)), redo AS (SELECT partition"
    " FROM l WHERE gone OR (SELECT count(*) FROM txn_source_names n WHERE n.source = %(s)s"
    " AND n.partition = l.partition) >= %(most)s), cut AS (DELETE FROM txn_source_names n"
    " USING redo WHERE n.source = %(s)s AND n.partition = redo.partition), put AS ("
    " INSERT INTO txn_source_names (source, partition, names) SELECT * FROM (SELECT %(s)s,"
    " l.partition, CASE WHEN l.gone THEN (SELECT string_agg(name, E'\\n') FROM txn_source_file"
    " WHERE source = %(s)s AND partition = l.partition) WHEN l.partition IN (SELECT * FROM redo)"
    " THEN concat_ws(E'\\n', (SELECT string_agg(names, E'\\n') FROM txn_source_names"
    " WHERE source = %(s)s AND partition = l.partition), l.new) ELSE l.new END AS names"
    " FROM l OFFSET 0) AS n WHERE names IS NOT NULL)"
    " INSERT INTO txn_source_partition (source, partition, folders, end_offset, newest)"
    " SELECT %(s)s, l.partition, l.folders, coalesce(n.top + 1, 0), coalesce(n.files, '{}')"
    " FROM l CROSS JOIN LATERAL ("
    " SELECT max(last_offset) AS top, jsonb_object_agg(name, jsonb_build_array(size, mtime_ns))"
    " AS files FROM (SELECT * FROM txn_source_file WHERE source = %(s)s"
    " AND partition = l.partition AND last_offset >= 0 AND last_offset = ("
    " SELECT max(last_offset) FROM txn_source_file WHERE source = %(s)s"
    " AND partition = l.partition) OFFSET 0) AS f) AS n"
    " ON CONFLICT (source, partition) DO UPDATE SET folders = excluded.folders,"
    " end_offset = excluded.end_offset, newest = excluded.newest"
    " RETURNING partition, folders, end_offset, newest"
)
_FORGET = (
    "WITH f AS (DELETE FROM txn_source_file WHERE source = %(s)s"
    " AND partition = ANY(%(ps)s::text[])), n AS (DELETE FROM txn_source_names"
    " WHERE source = %(s)s AND partition = ANY(%(ps)s::text[])) DELETE FROM txn_source_partition"
    " WHERE source = %(s)s AND partition = ANY(%(ps)s::text[])"
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
        if "_catalog" not in self.__dict__:  # (sources are frozen dataclasses)
            object.__setattr__(self, "_catalog", MemoryCatalog())
        return self.__dict__["_catalog"]

    def with_catalog(self: S, catalog: FileCatalog) -> S:
        bound = copy.copy(self)
        for answer in ("_prefetched", "_last_look", "_catalog_answer"):  # another catalog's
            bound.__dict__.pop(answer, None)
        object.__setattr__(bound, "_catalog", catalog)
        return bound


def with_log_catalog(source: Any, engine: Engine) -> Any:
    """``source``, if it keeps a catalog, as a copy keeping it in the log's Postgres."""
    if isinstance(source, UsesCatalog):
        return source.with_catalog(PostgresCatalog(engine))
    return source
