"""The lake sink protocol: staged files, an exactly-once commit in txid order, reads as of txid N.

1. **Stage** (:mod:`airflow_txn_provider.sinks.staging`): executors write the attempt's Parquet
   into ``<staging root>/<pipeline>/<txid>/a<attempt>-<run>/``; the job records the files with
   the attempt's output, fenced by the attempt.
2. **Commit** (:meth:`LakeSink.commit`, in the log's commit, under its pipeline lock): add (or
   merge) exactly the recorded files in ONE table commit that records ``(pipeline, txid)``, or
   nothing if the table holds the txid already, from a crash between its commit and the log's
   (:func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit`).
3. **Clean up** (:meth:`LakeSink.cleanup`, after the log's commit): delete the txid's other
   directories (failed attempts, duplicate runs, merged-away files).

docs/lake.md has the picture. Nothing here imports Spark; a table library (``deltalake``,
``pyiceberg``) is imported only when a table is opened.
"""

from __future__ import annotations

import abc
import logging
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from airflow_txn_provider.rules.coordinator import plan_sink_commit
from airflow_txn_provider.rules.exceptions import (
    InvalidNameError,
    LakeSinkError,
    TxidNotReadableError,
)
from airflow_txn_provider.rules.names import COLUMN, PIPELINE, check_name
from airflow_txn_provider.rules.specs import from_spec, to_spec
from airflow_txn_provider.rules.vocabulary import LAKE_OUTPUT_PREFIX, SinkAction, lake_output_key
from airflow_txn_provider.sinks.schema import check_schema
from airflow_txn_provider.utils.lineage import path_dataset

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

log = logging.getLogger(__name__)

MODES = ("append", "merge")
OUTPUT_PREFIX = LAKE_OUTPUT_PREFIX
"""A txid's recorded output holds each sink's staged files under ``lake:<sink name>``."""
SINK_SPEC = "sink"
"""Key of the sink's spec (:meth:`LakeSink.to_spec`) in a committed txid's ``lake:<sink name>``
output: a rewind opens the table with it, where the DAG's sinks are not known."""


@dataclass(frozen=True)
class StagedFiles:
    """What one attempt staged for one sink, as recorded with its output in the log.

    :param directory: the attempt's own directory (a path or URI).
    :param files: ``(file name within directory, size in bytes, rows)`` of each Parquet file.
    :param schema: the files' columns, as Arrow's schema serialised (for the commit's check).
    """

    directory: str
    files: tuple[tuple[str, int, int], ...]
    schema: str = ""

    @property
    def rows(self) -> int:
        return sum(rows for _, _, rows in self.files)

    def paths(self) -> list[str]:
        return [posixpath.join(self.directory, name) for name, _, _ in self.files]

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "files": [list(f) for f in self.files],
            "rows": self.rows,
            "schema": self.schema,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StagedFiles:
        return cls(
            str(value["directory"]),
            tuple((str(n), int(s), int(r)) for n, s, r in value["files"]),
            str(value.get("schema", "")),
        )

    def exists(self) -> bool:  # a fill applies a live txid's staged files a while later
        fs, paths = _filesystem(self.directory)[0], [_filesystem(p)[1] for p in self.paths()]
        return all(info.type.name == "File" for info in fs.get_file_info(paths))

    def read(self) -> pa.Table:
        """The staged rows, as one Arrow table (a ``Check`` on the sink is given them)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.files:  # no rows: the schema's columns
            return (self.arrow_schema() or pa.schema([])).empty_table()
        fs = _filesystem(self.directory)[0]
        return pq.read_table([_filesystem(p)[1] for p in self.paths()], filesystem=fs)

    def discard(self) -> None:
        """Delete the directory (best effort: a leftover is garbage, never data)."""
        try:
            fs, path = _filesystem(self.directory)
            fs.delete_dir(path)
        except OSError as err:
            log.warning("could not delete %s: %s", self.directory, err)

    def arrow_schema(self) -> pa.Schema | None:
        if not self.schema:
            return None
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(self.schema)))


def schema_to_hex(schema: pa.Schema) -> str:
    return bytes(schema.remove_metadata().serialize()).hex()


@dataclass(frozen=True)
class SinkCommit:
    """What :meth:`LakeSink.commit` did for one txid: ``action`` (``add``, ``already_in_table``,
    or ``empty``: no rows, no table commit), the table ``version`` that holds the txid (Delta's
    version, Iceberg's snapshot id; ``None`` when empty) and the rows added."""

    sink: str
    action: str
    version: int | None
    rows: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "version": self.version, "rows": self.rows}


@dataclass(frozen=True)
class LakeSink(abc.ABC):
    """A lake table a pipeline's txids commit into, in txid order, each exactly once.

    :param name: the output's name: the key the transform returns its DataFrame under (or the
        pipeline's only output), and part of the staged output's key in the log (``lake:<name>``).
    :param mode: ``append`` (each txid's rows are added) or ``merge`` (each txid's rows replace
        the table's rows with the same ``keys`` and insert the rest; a batch must hold one row
        per key).
    :param keys: the merge keys (``merge`` mode only).
    :param txid_column: if set, a column of that name holding the txid is added to every row,
        so readers can tell which transaction wrote a row.
    """

    kind: ClassVar[str] = ""

    name: str
    mode: str = "append"
    keys: Sequence[str] = ()
    txid_column: str | None = None

    def __post_init__(self) -> None:
        check_name(self.name, COLUMN, what="sink name")
        if self.mode not in MODES:
            raise ValueError(f"sink {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.keys, str):
            raise InvalidNameError(f"sink {self.name!r}: keys must be a list of column names")
        object.__setattr__(self, "keys", tuple(self.keys))
        for key in self.keys:  # they reach the merge predicate
            check_name(key, COLUMN, what=f"sink {self.name!r}: merge key")
        if self.mode == "merge" and not self.keys:
            raise ValueError(f"sink {self.name!r}: merge mode needs the key columns (keys=...)")
        if self.mode == "append" and self.keys:
            raise ValueError(f"sink {self.name!r}: keys apply to merge mode only")
        if self.txid_column is not None:
            check_name(self.txid_column, COLUMN, what=f"sink {self.name!r}: txid_column")

    @property
    def output_key(self) -> str:
        """Key of this sink's :class:`StagedFiles` in a txid's recorded output."""
        return lake_output_key(self.name)

    @property
    @abc.abstractmethod
    def staging_root(self) -> str:
        """Where attempts stage their files (under the table's own location, so a format's
        cleanup of unreferenced files, Delta's VACUUM or Iceberg's orphan removal, is a
        backstop for ours)."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The table's URI: names the Airflow Asset its commits update."""

    def lineage_dataset(self) -> tuple[str, str]:
        """OpenLineage's ``(namespace, name)`` of the table: its storage location."""
        return path_dataset(self.uri)

    def lineage_symlinks(self, log_url: str | None) -> list[tuple[str, str, str]]:
        """Other names of the table, ``(namespace, name, type)``: a catalog's (none here)."""
        return []

    def stage_dir(self, pipeline: str, txid: int, attempt: int, run: str) -> str:
        """The directory of one run of ``(txid, attempt)``: a retried task writes a new one, so
        a late duplicate can never overwrite files another run recorded."""
        return posixpath.join(self.txid_dir(pipeline, txid), f"a{attempt}-{run}")

    def txid_dir(self, pipeline: str, txid: int) -> str:
        check_name(pipeline, PIPELINE)  # it names a directory
        return posixpath.join(self.staging_root, pipeline, f"{txid:020d}")

    @property
    def conn_ids(self) -> tuple[str, ...]:
        """The Airflow connections this sink opens (their credentials reach a ``spark-submit``
        driver through its environment:
        :func:`airflow_txn_provider.utils.credentials.connection_env`).
        """
        return ()

    def to_spec(self) -> dict[str, Any]:
        """JSON-compatible description: ``{"class": "module:Name", "args": {...}}``."""
        return to_spec(self)

    # -- the table ---------------------------------------------------------------------------

    @abc.abstractmethod
    def open(self, log_url: str | None = None) -> LakeTable:
        """A handle on the table (``log_url``: the transaction log's, for a catalog kept in it)."""

    # -- the protocol ------------------------------------------------------------------------

    def commit(
        self,
        table: LakeTable,
        pipeline: str,
        txid: int,
        attempt: int,
        staged: StagedFiles | None,
        *,
        rewound_through: int = 0,
        committed_through: int = 0,
    ) -> SinkCommit:
        """Add ``staged`` to the table in one commit recording ``(pipeline, txid)``, unless the
        table holds that txid already (``rewound_through``, ``committed_through``: the rule's,
        :func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit`). Raises
        :class:`LakeSchemaMismatchError` (nothing added) when the files' columns differ."""
        table_txid = table.committed_txid(pipeline)
        action = plan_sink_commit(
            table_txid,
            txid,
            pipeline=pipeline,
            attempt=attempt,
            sink=self.name,
            table_attempt=table.committed_attempt(pipeline, txid) if table_txid >= txid else None,
            rewound_through=rewound_through,
            committed_through=committed_through,
        )
        if action is SinkAction.REPLACE:
            # An earlier attempt's commit got this far and then failed (at another sink, or
            # the log's own step), or a rewind undid the txids from this one on in the log and
            # the table has not followed yet: their rows go, this attempt's come in their place.
            version = table.rewind(pipeline, txid - 1)
            log.warning(
                "pipeline=%s txid=%s attempt=%s sink=%s: the table held txid %s from an attempt "
                "the log does not commit; rewound to txid %s (version %s) to replace it",
                pipeline,
                txid,
                attempt,
                self.name,
                table_txid,
                txid - 1,
                version,
            )
        if action is SinkAction.ALREADY_IN_TABLE:
            version = table.version_of(pipeline, txid)
            log.info(
                "pipeline=%s txid=%s attempt=%s sink=%s: the table holds this txid already "
                "(version %s): nothing added twice",
                pipeline,
                txid,
                attempt,
                self.name,
                version,
            )
            return SinkCommit(self.name, action.value, version)
        if staged is None or staged.rows == 0:
            return SinkCommit(self.name, "empty", None)
        schema = staged.arrow_schema()
        if schema is None:
            schema = _footer_schema(staged.paths()[0])
        current = table.schema()
        if current is not None:
            check_schema(
                current, schema, sink=self.name, pipeline=pipeline, txid=txid, attempt=attempt
            )
        files = [
            (p, size, rows)
            for p, (_, size, rows) in zip(staged.paths(), staged.files, strict=True)
            if rows
        ]
        missing = _missing([p for p, _, _ in files])
        if missing:  # a Delta add would reference them anyway, and its readers fail
            raise LakeSinkError(
                f"lake sink {self.name!r}: staged files are gone: {missing[:3]}; replay the txid",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )
        version = table.add(
            files,
            schema,
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
            merge_keys=self.keys if self.mode == "merge" else (),
        )
        log.info(
            "pipeline=%s txid=%s attempt=%s sink=%s: %s %s rows in %s files, table version %s",
            pipeline,
            txid,
            attempt,
            self.name,
            "merged" if self.mode == "merge" else "added",
            staged.rows,
            len(files),
            version,
        )
        return SinkCommit(self.name, action.value, version, staged.rows)

    def cleanup(self, pipeline: str, txid: int, committed: StagedFiles | None) -> int:
        """Delete the txid's staging directories that the table does not reference: every one in
        merge mode (the merge rewrote the rows), all but the committed one in append mode.
        Best effort (a leftover is garbage, never data); returns how many were deleted."""
        keep = committed.directory if committed is not None and self.mode == "append" else None
        fs, root = _filesystem(self.txid_dir(pipeline, txid))
        import pyarrow.fs as pafs

        try:
            infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except OSError as err:
            log.warning("sink=%s: could not list %s for cleanup: %s", self.name, root, err)
            return 0
        removed = 0
        for info in infos:
            if info.type != pafs.FileType.Directory or posixpath.basename(info.path) == (
                posixpath.basename(keep) if keep else None
            ):
                continue
            try:
                fs.delete_dir(info.path)
                removed += 1
            except OSError as err:
                log.warning("sink=%s: could not delete %s: %s", self.name, info.path, err)
        return removed

    def read_as_of(self, pipeline: str, txid: int, *, log_url: str | None = None) -> pa.Table:
        """The table as it was when ``txid`` of ``pipeline`` committed (the newest table version
        holding a txid <= ``txid``). Raises :class:`~airflow_txn_provider.rules.exceptions.
        TxidNotReadableError` when no version does."""
        table = self.open(log_url)
        return table.read(table.version_as_of(pipeline, txid))


class LakeTable(abc.ABC):
    """One open lake table: the few operations the protocol needs of a format."""

    @abc.abstractmethod
    def committed_txid(self, pipeline: str) -> int:
        """The newest txid of ``pipeline`` the table holds (0: none, or no table yet)."""

    @abc.abstractmethod
    def schema(self) -> pa.Schema | None:
        """The table's columns (``None``: the table does not exist yet)."""

    @abc.abstractmethod
    def add(
        self,
        files: Sequence[tuple[str, int, int]],
        schema: pa.Schema,
        *,
        pipeline: str,
        txid: int,
        attempt: int,
        merge_keys: Sequence[str],
    ) -> int:
        """Add (or merge by ``merge_keys``) ``files`` in ONE table commit that records
        ``(pipeline, txid)``, creating the table with ``schema`` if missing; return the version."""

    @abc.abstractmethod
    def committed_attempt(self, pipeline: str, txid: int) -> int | None:
        """The attempt whose commit of ``txid`` the table holds now (``None``: none, unknown)."""

    @abc.abstractmethod
    def rewind(self, pipeline: str, txid: int) -> int | None:
        """Take the table back to its content right after ``pipeline``'s commit of ``txid``
        (before its first commit when ``txid`` is 0), in ONE table commit that records ``txid``
        as the pipeline's newest; return the version that holds it (``None``: nothing to undo).

        Only this pipeline's commits are undone: if another writer committed to the table after
        them, :class:`~airflow_txn_provider.rules.exceptions.LakeTableOutOfSyncError` (nothing
        changed), since undoing them would lose its rows."""

    @abc.abstractmethod
    def versions(self, pipeline: str) -> list[tuple[int, int]]:
        """``(txid, version)`` of the table version that holds each txid >= 1 of ``pipeline``
        (the newest such version, after a rewind), by txid."""

    @abc.abstractmethod
    def read(self, version: int) -> pa.Table:
        """The table's rows at ``version``."""

    def version_of(self, pipeline: str, txid: int) -> int | None:
        return next((v for t, v in reversed(self.versions(pipeline)) if t == txid), None)

    def version_as_of(self, pipeline: str, txid: int) -> int:
        found = [v for t, v in self.versions(pipeline) if t <= txid]
        if not found:
            raise TxidNotReadableError(
                f"the table holds no commit of txid <= {txid} by this pipeline",
                pipeline=pipeline,
                txid=txid,
            )
        return found[-1]


# -- files ---------------------------------------------------------------------------------------


def require(module: str, extra: str) -> None:
    """Import ``module`` (a format's library, an optional dependency) or say how to install it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        raise LakeSinkError(
            f"this lake sink needs the {module!r} package: "
            f"pip install 'airflow-txn-provider[{extra}]'"
        ) from err


def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    import pyarrow.fs as pafs

    if "://" not in uri and not uri.startswith("/"):
        raise LakeSinkError(f"lake paths must be absolute or URIs, got {uri!r}")
    return pafs.FileSystem.from_uri(uri)


def _missing(paths: Sequence[str]) -> list[str]:
    import pyarrow.fs as pafs

    if not paths:
        return []
    fs, _ = _filesystem(paths[0])
    infos = fs.get_file_info([_filesystem(p)[1] for p in paths])
    return [p for p, info in zip(paths, infos, strict=True) if info.type != pafs.FileType.File]


def _footer_schema(path: str) -> pa.Schema:
    import pyarrow.parquet as pq

    fs, p = _filesystem(path)
    return pq.read_schema(p, filesystem=fs)


def list_staged(directory: str) -> StagedFiles:
    """The Parquet files a finished Spark write left in ``directory``: names, sizes and row
    counts (read from each file's footer), and their schema. A write without ``_SUCCESS`` did
    not finish: refused."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = _filesystem(directory)
    infos = fs.get_file_info(pafs.FileSelector(root))
    names = {posixpath.basename(i.path): i for i in infos if i.type == pafs.FileType.File}
    if "_SUCCESS" not in names:
        raise LakeSinkError(f"the write into {directory} did not finish (no _SUCCESS)")
    files, schema = [], None
    for name in sorted(names):
        if not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        meta = pq.read_metadata(names[name].path, filesystem=fs)
        if schema is None:
            schema = meta.schema.to_arrow_schema()
        files.append((name, int(names[name].size), int(meta.num_rows)))
    return StagedFiles(directory, tuple(files), schema_to_hex(schema) if schema is not None else "")


def sink_from_spec(spec: Mapping[str, Any] | str) -> LakeSink:
    """The sink described by :meth:`LakeSink.to_spec` (a dict or its JSON)."""
    return cast(LakeSink, from_spec(spec, LakeSink, what="lake sink"))


__all__ = [
    "MODES",
    "SINK_SPEC",
    "LakeSink",
    "LakeTable",
    "SinkCommit",
    "StagedFiles",
    "list_staged",
    "sink_from_spec",
]
