"""An Apache Iceberg table as a lake sink, through ``pyiceberg`` and its SQL catalog.

The catalog lives in Postgres, by default in the transaction log's own database (pyiceberg
creates its ``iceberg_tables`` and ``iceberg_namespace_properties`` tables there). A txid's table
commit is one Iceberg transaction: the staged files added (``add_files``; merge mode: ``upsert``)
with ``txn.pipeline``, ``txn.txid`` and ``txn.attempt`` in the snapshot summary, and the table
property ``txn.<pipeline>.txid`` set to the txid, atomically with the data.

Tables this sink creates have ``commit.retry.num-retries = 0``: pyiceberg retries a failed
catalog commit by itself, and a retry of a commit whose answer was lost would add the files
twice. Our own retry sees the txid in the table instead.
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_txn_provider.rules.exceptions import InvalidNameError, TxnConfigError
from airflow_txn_provider.rules.names import COLUMN, CONN_ID, check_name
from airflow_txn_provider.sinks.base import LakeSink, LakeTable, require
from airflow_txn_provider.sinks.rewind import first_undone_commit, held_versions
from airflow_txn_provider.utils.credentials import connection_url
from airflow_txn_provider.utils.lineage import path_dataset

if TYPE_CHECKING:
    import pyarrow as pa

TXID_PROPERTY = "txn.{pipeline}.txid"


@dataclass(frozen=True)
class IcebergSink(LakeSink):
    """The Iceberg table ``table`` (``namespace.name``) of a SQL catalog.

    :param table: ``namespace.name``.
    :param warehouse: where the catalog puts tables it creates (an absolute path or URI); the
        table lives in ``<warehouse>/<namespace>.db/<name>``.
    :param catalog_conn_id: the Airflow connection of the catalog's Postgres database (looked
        up where the catalog is opened:
        :func:`airflow_txn_provider.utils.credentials.connection_url`). ``None`` with no
        ``catalog_uri`` (the default): the transaction log's database.
    :param catalog_uri: the catalog's SQLAlchemy URL, without a password (``~/.pgpass``, a
        trusted socket): the sink's spec travels in ``spark-submit``'s arguments, so a URL with
        a password is refused; put it in a connection and pass ``catalog_conn_id``.
    :param catalog_name: the catalog's name (rows of several catalogs can share its tables).
    """

    kind: ClassVar[str] = "iceberg"

    table: str = ""
    warehouse: str = ""
    catalog_uri: str | None = None
    catalog_name: str = "txn"
    catalog_conn_id: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        parts = self.table.split(".") if isinstance(self.table, str) else []
        if len(parts) != 2:
            raise InvalidNameError(
                f"sink {self.name!r}: table must be 'namespace.name', got {self.table!r}"
            )
        for part in parts:  # they name directories of the warehouse
            check_name(part, COLUMN, what=f"sink {self.name!r}: Iceberg namespace or table")
        wh = self.warehouse.rstrip("/")
        if not wh or ("://" not in wh and not wh.startswith("/")):
            raise ValueError(
                f"sink {self.name!r}: warehouse must be an absolute path or a URI, got "
                f"{self.warehouse!r}"
            )
        object.__setattr__(self, "warehouse", wh)
        if self.catalog_conn_id is not None:
            check_name(self.catalog_conn_id, CONN_ID, what=f"sink {self.name!r}: catalog_conn_id")
        if self.catalog_uri is not None and self.catalog_conn_id is not None:
            raise TxnConfigError(
                f"sink {self.name!r}: give catalog_conn_id or catalog_uri, not both"
            )
        if self.catalog_uri is not None and _has_password(self.catalog_uri):
            raise TxnConfigError(
                f"sink {self.name!r}: catalog_uri holds a password, which would show in the "
                "job's command line and the task log; put the catalog in an Airflow connection "
                "and pass catalog_conn_id"
            )

    @property
    def conn_ids(self) -> tuple[str, ...]:
        return () if self.catalog_conn_id is None else (self.catalog_conn_id,)

    @property
    def location(self) -> str:
        namespace, name = self.table.split(".")
        return posixpath.join(self.warehouse, f"{namespace}.db", name)

    @property
    def staging_root(self) -> str:
        return posixpath.join(self.location, "data", "txn")

    @property
    def uri(self) -> str:
        return f"iceberg://{self.catalog_name}/{self.table.replace('.', '/')}"

    def lineage_dataset(self) -> tuple[str, str]:
        """Its location, as OpenLineage's Spark integration names an Iceberg table: one dataset
        with what other engines report of it (``uri``'s catalog label is in no convention, and
        is the same in every deployment by default)."""
        return path_dataset(self.location)

    def lineage_symlinks(self, log_url: str | None) -> list[tuple[str, str, str]]:
        """The catalog's name of the table: namespace its catalog's database
        (``postgres://host:port/database``, never the password), name
        ``<catalog_name>.<namespace>.<table>`` (a SQL catalog keys its tables by all three)."""
        from sqlalchemy.engine import make_url

        url: str | None = self.catalog_uri or log_url
        if self.catalog_conn_id is not None:
            url = connection_url(self.catalog_conn_id, what=f"the catalog of sink {self.name!r}")
        if not url:
            return []
        db = make_url(url)
        where = f"postgres://{db.host or 'localhost'}:{db.port or 5432}/{db.database}"
        return [(where, f"{self.catalog_name}.{self.table}", "TABLE")]

    def open(self, log_url: str | None = None) -> IcebergLakeTable:
        require("pyiceberg", "iceberg")
        uri: str | None = self.catalog_uri or log_url
        if self.catalog_conn_id is not None:
            uri = connection_url(self.catalog_conn_id, what=f"the catalog of sink {self.name!r}")
        if not uri:
            raise ValueError(
                f"sink {self.name!r}: no catalog_conn_id or catalog_uri, and no transaction log "
                "URL to default to"
            )
        return IcebergLakeTable(self, uri)


def _has_password(uri: str) -> bool:
    from sqlalchemy.engine import make_url

    try:
        url = make_url(uri)
    except Exception:  # not a URL SQLAlchemy reads: the catalog will say so; look for the shape
        return "@" in uri and ":" in uri.split("@", 1)[0].split("://", 1)[-1]
    return bool(url.password) or "password" in {k.lower() for k in url.query}


_catalogs: dict[tuple[str, str, str], Any] = {}
_catalogs_lock = threading.Lock()


def _catalog(name: str, uri: str, warehouse: str) -> Any:
    """One catalog (and so one connection pool) per process and catalog. Its first opening
    creates the catalog's tables; two processes (a txid's job and a fill) doing that at the same
    moment race in Postgres, and the loser finds them there when it tries again."""
    key = (name, uri, warehouse)
    with _catalogs_lock:
        if key not in _catalogs:
            from pyiceberg.catalog.sql import SqlCatalog
            from sqlalchemy.exc import IntegrityError

            for last_try in (False, False, True):
                try:
                    _catalogs[key] = SqlCatalog(
                        name, uri=uri, warehouse=warehouse, pool_pre_ping="true"
                    )
                    break
                except IntegrityError:
                    if last_try:
                        raise
    return _catalogs[key]


class IcebergLakeTable(LakeTable):
    def __init__(self, sink: IcebergSink, catalog_uri: str) -> None:
        self.sink = sink
        self.catalog_uri = catalog_uri
        self.identifier = tuple(sink.table.split("."))

    @property
    def catalog(self) -> Any:
        # Opened on first use, not here: inside the log's commit, whose retry waits out a
        # Postgres restart (the catalog connects at once to create its tables).
        return _catalog(self.sink.catalog_name, self.catalog_uri, self.sink.warehouse)

    def _table(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def committed_txid(self, pipeline: str) -> int:
        table = self._table()
        if table is None:
            return 0
        return int(table.properties.get(TXID_PROPERTY.format(pipeline=pipeline), 0))

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else table.schema().as_arrow()

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
        table = self._table()
        if table is None:
            self.catalog.create_namespace_if_not_exists(self.identifier[0])
            table = self.catalog.create_table_if_not_exists(
                self.identifier,
                schema=schema,
                location=self.sink.location,
                properties={"commit.retry.num-retries": "0"},
            )
        summary = {"txn.pipeline": pipeline, "txn.txid": str(txid), "txn.attempt": str(attempt)}
        paths = [p for p, _, _ in files]
        with table.transaction() as tx:
            if merge_keys:
                import pyarrow.parquet as pq

                tx.upsert(
                    pq.read_table(paths, schema=table.schema().as_arrow()),
                    join_cols=list(merge_keys),
                    snapshot_properties=summary,
                )
            else:
                tx.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
            tx.set_properties({TXID_PROPERTY.format(pipeline=pipeline): str(txid)})
        version = self.version_of(pipeline, txid)
        assert version is not None, "an Iceberg commit that recorded no snapshot"
        return version

    def _lineage(self, table: Any) -> list[tuple[Any, str | None, int | None, int | None]]:
        """``(snapshot, pipeline, txid, attempt)`` of the current snapshot and its ancestors,
        newest first."""
        from pyiceberg.table.snapshots import ancestors_of

        if table is None or table.current_snapshot() is None:
            return []
        found = []
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            txid, attempt = props.get("txn.txid"), props.get("txn.attempt")
            found.append(
                (
                    snapshot,
                    props.get("txn.pipeline"),
                    None if txid is None else int(txid),
                    None if attempt is None else int(attempt),
                )
            )
        return found

    def committed_attempt(self, pipeline: str, txid: int) -> int | None:
        for _, by, t, attempt in self._lineage(self._table()):
            if by == pipeline and t == txid:
                return attempt
        return None

    def rewind(self, pipeline: str, txid: int) -> int | None:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.table.update.snapshot import ManageSnapshots

        table = self._table()
        lineage = self._lineage(table)
        commits = [(int(s.snapshot_id), by, t) for s, by, t, _ in lineage]
        first = first_undone_commit(commits, pipeline=pipeline, keep_txid=txid, sink=self.sink.uri)
        if first is None:
            return None
        parent = next(s for s, *_ in lineage if s.snapshot_id == first).parent_snapshot_id
        summary = {"txn.pipeline": pipeline, "txn.txid": str(txid), "txn.rewind": "true"}
        # One catalog commit: the current snapshot goes back (or, when the undone commits were
        # the table's first, every file is deleted) and the pipeline's txid property with it.
        with table.transaction() as tx:
            if parent is None:
                tx.delete(AlwaysTrue(), snapshot_properties=summary)
            else:
                ManageSnapshots(tx).set_current_snapshot(snapshot_id=parent)
            tx.set_properties({TXID_PROPERTY.format(pipeline=pipeline): str(txid)})
        return self.version_of(pipeline, txid)

    def versions(self, pipeline: str) -> list[tuple[int, int]]:
        # Newest first: an upsert may write two snapshots for one txid, and the newer (complete)
        # one must win; a rewind to txid 0 is a delete on top of the undone snapshots.
        commits = [(int(s.snapshot_id), by, t) for s, by, t, _ in self._lineage(self._table())]
        return held_versions(commits, pipeline=pipeline)

    def read(self, version: int) -> pa.Table:
        table = self._table()
        assert table is not None
        return table.scan(snapshot_id=version).to_arrow()
