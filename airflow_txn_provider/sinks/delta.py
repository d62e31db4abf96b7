"""A Delta Lake table as a lake sink, through ``deltalake`` (delta-rs): no JVM, no Maven.

A txid's table commit is one Delta commit whose ``txn`` action is the app transaction
``(appId = pipeline, version = txid)``, Delta's own idempotent-writer record
(``DeltaTable.transaction_version(pipeline)`` reads it back), with the pipeline, txid and attempt
also in the commit's ``commitInfo`` (``history()``), which is how "as of txid N" finds versions.

Append mode adds the staged files as they are (``add`` actions with paths relative to the table
root: they are staged under it, in ``txn/``). Merge mode streams them through ``merge``, which
rewrites the matched files in the committing process.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_txn_provider.rules.names import quote_ident
from airflow_txn_provider.sinks.base import LakeSink, LakeTable, require
from airflow_txn_provider.sinks.rewind import first_undone_commit, held_versions

if TYPE_CHECKING:
    import pyarrow as pa

HISTORY_LIMIT = 10_000
"""Commits of the table's history read when looking a txid's version up (newest first)."""
HISTORY_TRIES = 20
"""Reads of the history before giving up while other writers keep committing (see _history)."""


@dataclass(frozen=True)
class DeltaSink(LakeSink):
    """A Delta table at ``table_uri`` (an absolute path, or a URI delta-rs and Spark both read
    with credentials from the environment). Created with the first batch's schema if missing.

    Staged files live in ``<table_uri>/txn/<pipeline>/…``: committed ones are referenced there
    by the Delta log; the others are deleted by the commit's cleanup (and VACUUM would).
    """

    kind: ClassVar[str] = "delta"

    table_uri: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        uri = self.table_uri.rstrip("/")
        if not uri or ("://" not in uri and not uri.startswith("/")):
            raise ValueError(
                f"sink {self.name!r}: table_uri must be an absolute path or a URI, got "
                f"{self.table_uri!r}"
            )
        object.__setattr__(self, "table_uri", uri)

    @property
    def staging_root(self) -> str:
        return posixpath.join(self.table_uri, "txn")

    @property
    def uri(self) -> str:
        return self.table_uri if "://" in self.table_uri else f"file://{self.table_uri}"

    def open(self, log_url: str | None = None) -> DeltaLakeTable:
        require("deltalake", "delta")
        return DeltaLakeTable(self.table_uri)


class DeltaLakeTable(LakeTable):
    """One commit's (or one reader's) handle: the Delta log is read once when the table is first
    looked at, and again only after this handle committed (delta-rs does not refresh a handle
    after its own commits)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._current: Any = None

    def _table(self, version: int | None = None) -> Any:
        """The table as it is (or at ``version``), or ``None`` if it does not exist."""
        from deltalake import DeltaTable

        if version is not None:
            return DeltaTable(self.uri, version=version)
        if self._current is None:
            if not DeltaTable.is_deltatable(self.uri):
                return None
            self._current = DeltaTable(self.uri)
        return self._current

    def committed_txid(self, pipeline: str) -> int:
        dt = self._table()
        return 0 if dt is None else int(dt.transaction_version(pipeline) or 0)

    def schema(self) -> pa.Schema | None:
        import pyarrow as pa

        dt = self._table()
        return None if dt is None else pa.schema(dt.schema().to_arrow())

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
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        dt = self._table()
        if dt is None:
            dt = DeltaTable.create(self.uri, schema=schema, mode="ignore")
        self._current = None  # whatever happens next, the handle is out of date
        properties = CommitProperties(
            app_transactions=[Transaction(app_id=pipeline, version=txid)],
            custom_metadata={
                "txn.pipeline": pipeline,
                "txn.txid": str(txid),
                "txn.attempt": str(attempt),
            },
        )
        if merge_keys:
            import pyarrow.dataset as ds

            source = ds.dataset([p for p, _, _ in files], format="parquet").scanner().to_reader()
            predicate = " AND ".join(f"t.{quote_ident(k)} = s.{quote_ident(k)}" for k in merge_keys)
            (
                dt.merge(
                    source,
                    predicate,
                    source_alias="s",
                    target_alias="t",
                    commit_properties=properties,
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        else:
            now_ms = int(time.time() * 1000)
            actions = [
                AddAction(
                    path=self._relative(path),
                    size=size,
                    partition_values={},
                    modification_time=now_ms,
                    data_change=True,
                    stats=json.dumps({"numRecords": rows}),
                )
                for path, size, rows in files
            ]
            dt.create_write_transaction(
                actions, mode="append", schema=dt.schema(), commit_properties=properties
            )
        return self._newest_version_of(pipeline, txid)

    def committed_attempt(self, pipeline: str, txid: int) -> int | None:
        commit = self._newest_commit_of(pipeline, txid)
        attempt = None if commit is None else commit.get("txn.attempt")
        return None if attempt is None else int(attempt)

    def rewind(self, pipeline: str, txid: int) -> int | None:
        from deltalake.transaction import CommitProperties, Transaction

        dt = self._table()
        if dt is None:
            return None
        commits = [
            (
                int(c["version"]),
                c.get("txn.pipeline"),
                int(c["txn.txid"]) if "txn.txid" in c else None,
            )
            for c in self._history(HISTORY_LIMIT)
        ]
        first = first_undone_commit(commits, pipeline=pipeline, keep_txid=txid, sink=self.uri)
        if first is None:
            return None
        self._current = None
        # RESTORE re-adds what the undone commits removed (a merge's rewritten files) and removes
        # what they added, in one commit; its app transaction takes the pipeline's back to txid.
        dt.restore(
            first - 1,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=pipeline, version=txid)],
                custom_metadata={
                    "txn.pipeline": pipeline,
                    "txn.txid": str(txid),
                    "txn.rewind": "true",
                },
            ),
        )
        return self._newest_version_of(pipeline, txid)

    def _history(self, limit: int) -> list[dict[str, Any]]:
        """The table's newest ``limit`` commits, newest first, each with its true ``version``.

        delta-rs's ``history()`` lists the commits on storage, those newer than the handle's
        snapshot included, but numbers them down from the snapshot's version: once another
        writer has committed, every number is off by as many commits (the stack test saw "read
        as of txid N" resolve to txid N-1's version while a pipeline committed). So the handle
        is brought to the newest commit first, and the history read again if one landed while
        it was read (commits only ever append: the same newest version after the read means
        nothing newer was listed).
        """
        from deltalake import DeltaTable

        dt = self._table()
        for _ in range(HISTORY_TRIES):
            dt.update_incremental()
            commits = dt.history(limit)
            if DeltaTable(self.uri, without_files=True).version() == dt.version():
                return commits
        raise RuntimeError(
            f"Delta table {self.uri}: commits kept landing while its history was read "
            f"({HISTORY_TRIES} tries)"
        )

    def _newest_commit_of(self, pipeline: str, txid: int) -> dict[str, Any] | None:
        dt = self._table()
        if dt is None:
            return None
        # The newest commit is usually ours: a few commits back first, the history if need be
        # (history() reads one log file per commit).
        for limit in (16, HISTORY_LIMIT):
            for commit in self._history(limit):
                if commit.get("txn.pipeline") == pipeline and commit.get("txn.txid") == str(txid):
                    return dict(commit)
        return None

    def _newest_version_of(self, pipeline: str, txid: int) -> int:
        commit = self._newest_commit_of(pipeline, txid)
        if commit is None:
            raise RuntimeError(
                f"Delta table {self.uri}: the commit of txid {txid} is not in its log"
            )
        return int(commit["version"])

    def _relative(self, path: str) -> str:
        # Delta resolves add paths against the table root; absolute paths break its readers.
        root = self.uri.rstrip("/") + "/"
        if not path.startswith(root):
            raise ValueError(f"staged file {path} is not under the table root {root}")
        return path[len(root) :]

    def versions(self, pipeline: str) -> list[tuple[int, int]]:
        dt = self._table()
        if dt is None:
            return []
        commits = [
            (
                int(c["version"]),
                c.get("txn.pipeline"),
                int(c["txn.txid"]) if "txn.txid" in c else None,
            )
            for c in self._history(HISTORY_LIMIT)  # newest first
        ]
        return held_versions(commits, pipeline=pipeline)

    def read(self, version: int) -> pa.Table:
        dt = self._table(version)
        assert dt is not None
        return dt.to_pyarrow_table()
