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
import tempfile
import time
from typing import Any

log = logging.getLogger(__name__)


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


# -- a begin's prefetch, reused by its step under the lock -------------------------------------

_PREFETCH_REUSE_S = 60.0
"""The step under the lock reuses a prefetch of the same process at most this old."""
prefetched: dict[tuple[str, ...], tuple[float, dict[str, tuple[int, int]], dict[str, int]]] = {}


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
