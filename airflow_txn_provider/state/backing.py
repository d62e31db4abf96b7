"""The SQL tables of one map state: what Trident's ``TransactionalMap`` and ``OpaqueMap`` wrap,
the backing map.

A :class:`BackingTable` owns the state table ``txn_state_<name>``, its UNLOGGED staging table
``txn_stage_<name>`` and its undo table ``txn_undo_<name>``: their DDL, a batch's COPY into the
staging table, the one ``INSERT … ON CONFLICT DO UPDATE`` that folds it in (writing, in the same
statement, each key's row as it was before into the undo table), the rewind that puts those
rows back, and reads. It knows no pipeline, registry,
summary or typed error: :class:`~airflow_txn_provider.state.maps.MapState` composes it with
those. The kind's rule (:mod:`~airflow_txn_provider.state.kinds`) gives the statement's parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from airflow_txn_provider.log.models import Base
from airflow_txn_provider.log.schema import VERSION_TABLE
from airflow_txn_provider.rules.names import SQL_NAME, check_name, quote_ident, state_tables
from airflow_txn_provider.state.kinds import KindRule
from airflow_txn_provider.state.staging import STAGE_JOB_COLUMN, copy_rows
from airflow_txn_provider.state.undo import UndoRecords

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy.engine import Connection, Row


KEY_TYPES = frozenset(
    {
        "text",
        "bigint",
        "integer",
        "smallint",
        "boolean",
        "date",
        "timestamptz",
        "numeric",
        "double precision",
    }
)
VALUE_TYPES = frozenset({"bigint", "integer", "numeric", "double precision"})
COMBINERS = {
    # name: (binary SQL with {a} {b}, aggregate over staged deltas)
    "sum": ("{a} + {b}", "sum"),
    "max": ("GREATEST({a}, {b})", "max"),
    "min": ("LEAST({a}, {b})", "min"),
}
RESERVED = frozenset(
    {"value", "prev_value", "txid", "attempt", "delta", "singleton", STAGE_JOB_COLUMN}
)
FLOAT_TYPES = frozenset({"numeric", "double precision"})
"""Value types that can hold NaN and infinities."""
# Serialises DDL of state tables across processes.
DDL_LOCK_KEY = 0x7478_6E5F_7374_61  # "txn_sta"


def _log_tables() -> frozenset[str]:
    """The transaction log's own tables, which no state table may take the name of."""
    return frozenset([*Base.metadata.tables, VERSION_TABLE])


def check_table_names(name: str) -> None:
    for table in state_tables(name):
        if table in _log_tables():
            raise ValueError(
                f"state name {name!r} is refused: its table {table} is one of the transaction "
                "log's own tables; choose another name"
            )


def check_columns(keys: Mapping[str, str], value_type: str, combiner: str, fillfactor: int) -> None:
    """Refuse (``ValueError``) columns or settings a state table cannot have."""
    for column, sqltype in keys.items():
        check_name(column, SQL_NAME, what="key column")
        if column in RESERVED:
            raise ValueError(f"key column {column!r} is reserved; reserved: {sorted(RESERVED)}")
        if sqltype not in KEY_TYPES:
            raise ValueError(
                f"key column {column!r} has type {sqltype!r}; allowed: {sorted(KEY_TYPES)}"
            )
    if value_type not in VALUE_TYPES:
        raise ValueError(f"value_type {value_type!r}; allowed: {sorted(VALUE_TYPES)}")
    if combiner not in COMBINERS:
        raise ValueError(f"combiner {combiner!r}; allowed: {sorted(COMBINERS)}")
    if not 10 <= int(fillfactor) <= 100:
        raise ValueError(f"fillfactor {fillfactor!r} must be within 10..100")


def lock_ddl(conn: Connection) -> None:
    """Wait for other processes' DDL of state tables (until this transaction ends)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": DDL_LOCK_KEY})


@dataclass(frozen=True)
class BackingTable:
    """The state and staging tables of the state ``name`` (checked by its :class:`MapState`)."""

    name: str
    keys: Mapping[str, str]
    value_type: str
    combiner: str
    rule: KindRule
    fillfactor: int = 50
    undo: bool = True
    """Write undo records in the apply statement (what a rewind restores from). ``False`` only
    for the baseline of ``benchmarks/bench_undo.py``: such a state cannot be rewound."""

    # -- names -----------------------------------------------------------------------------------

    @property
    def table(self) -> str:
        return state_tables(self.name)[0]

    @property
    def stage_table(self) -> str:
        return state_tables(self.name)[1]

    @property
    def undo_table(self) -> str:
        return state_tables(self.name)[2]

    @property
    def key_columns(self) -> list[str]:
        return list(self.keys) or ["singleton"]

    @property
    def quoted_keys(self) -> list[str]:
        """The key columns as quoted SQL identifiers (``singleton`` for a global state)."""
        return [quote_ident(c) for c in self.key_columns]

    @property
    def qtable(self) -> str:
        return quote_ident(self.table)

    @property
    def qstage(self) -> str:
        return quote_ident(self.stage_table)

    @property
    def qundo(self) -> str:
        return quote_ident(self.undo_table)

    @property
    def row_columns(self) -> list[str]:
        """The stored row's columns after the keys: ``value`` and the kind's bookkeeping ones,
        what an undo record keeps as ``old_<column>``."""
        return [name for name, _ in self.row_ddl()]

    def row_ddl(self) -> list[tuple[str, str]]:
        """``(name, SQL type without constraints)`` of :attr:`row_columns`, from the kind's DDL."""
        columns = [("value", self.value_type)]
        for ddl in self.rule.columns(self.value_type):
            name, rest = ddl.split(None, 1)
            columns.append((name, rest.replace("NOT NULL", "").strip()))
        return columns

    # -- DDL -------------------------------------------------------------------------------------

    def exists(self, conn: Connection) -> bool:
        """Whether the state table exists."""
        return conn.execute(text("SELECT to_regclass(:t)"), {"t": self.qtable}).scalar() is not None

    def create_table(self, conn: Connection) -> None:
        """The state table, if missing: keys, value, the kind's bookkeeping columns."""
        if self.keys:
            key_ddl = [f"{quote_ident(c)} {t} NOT NULL" for c, t in self.keys.items()]
        else:
            key_ddl = ["singleton boolean NOT NULL DEFAULT true CHECK (singleton)"]
        cols = [*key_ddl, f"value {self.value_type}", *self.rule.columns(self.value_type)]
        cols.append(f"PRIMARY KEY ({', '.join(self.quoted_keys)})")
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {self.qtable} ({', '.join(cols)}) "
                f"WITH (fillfactor = {int(self.fillfactor)})"
            )
        )

    def key_types(self) -> list[str]:
        return list(self.keys.values()) or ["boolean"]

    def create_stage(self, conn: Connection) -> None:
        """The UNLOGGED staging table, if missing; its job column and finite-delta check, if
        missing."""
        stage_cols = [
            # txid, attempt and job come from SET LOCAL settings: a COPY carries keys and delta.
            "txid bigint NOT NULL DEFAULT current_setting('txn.stage_txid')::bigint",
            "attempt integer NOT NULL DEFAULT current_setting('txn.stage_attempt')::integer",
            *[f"{quote_ident(c)} {t}" for c, t in self.keys.items()],
            f"delta {self.value_type}",
        ]
        conn.execute(
            text(f"CREATE UNLOGGED TABLE IF NOT EXISTS {self.qstage} ({', '.join(stage_cols)})")
        )
        # Added, not declared above, so that a staging table of an earlier version gains it too;
        # only when missing: ALTER TABLE locks out the txids staging meanwhile (create runs at
        # every begin).
        if not self._has_column(conn, STAGE_JOB_COLUMN):
            conn.execute(
                text(
                    f"ALTER TABLE {self.qstage} ADD COLUMN IF NOT EXISTS {STAGE_JOB_COLUMN} text "
                    "NOT NULL DEFAULT COALESCE(current_setting('txn.stage_job', true), '')"
                )
            )
        if self.value_type in FLOAT_TYPES:
            # A NaN or infinite delta would poison the value for good: refused by the table too,
            # whoever writes it (staging refuses it earlier, naming the row).
            check = f"{self.stage_table}_finite_delta"[:63]
            exists = conn.execute(
                text(
                    "SELECT 1 FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass(:t)"
                ),
                {"c": check, "t": self.qstage},
            ).first()
            if exists is None:
                conn.execute(
                    text(
                        f"ALTER TABLE {self.qstage} ADD CONSTRAINT {quote_ident(check)} "
                        "CHECK (delta NOT IN ('NaN', 'Infinity', '-Infinity')) NOT VALID"
                    )
                )

    def _has_column(self, conn: Connection, column: str) -> bool:
        found = conn.execute(
            text(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(:t) "
                "AND attname = :c AND NOT attisdropped"
            ),
            {"t": self.qstage, "c": column},
        ).first()
        return found is not None

    # -- stage -----------------------------------------------------------------------------------

    def copy(
        self,
        conn: Connection,
        txid: int,
        attempt: int,
        rows: pa.Table | list[tuple[Any, ...]],
        job: str,
    ) -> int:
        """Replace ``job``'s staged rows of ``(txid, attempt)`` with checked ``rows``, by one
        binary COPY (:func:`~airflow_txn_provider.state.staging.copy_rows`)."""
        return copy_rows(
            conn,
            self.stage_table,
            self.keys,
            self.value_type,
            txid,
            attempt,
            rows,
            job=job,
            quote=quote_ident,
        )

    def staged_count(self, conn: Connection, txid: int, attempt: int) -> int:
        return int(
            conn.execute(
                text(f"SELECT count(*) FROM {self.qstage} WHERE txid = :t AND attempt = :a"),
                {"t": txid, "a": attempt},
            ).scalar_one()
        )

    def staged(self, conn: Connection, txid: int, attempt: int) -> list[tuple[Any, ...]]:
        columns = ", ".join([*(quote_ident(c) for c in self.keys), "delta"])
        rows = conn.execute(
            text(
                f"SELECT {columns} FROM {self.qstage} "
                f"WHERE txid = :t AND attempt = :a ORDER BY {columns}"
            ),
            {"t": txid, "a": attempt},
        )
        return [tuple(r) for r in rows]

    def stage_bucket_moves(
        self, conn: Connection, txid: int, attempt: int, source: BackingTable, bucket_size: int
    ) -> int:
        """Stage, as this table's batch of ``(txid, attempt)``, how many keys of ``source`` (a
        keyed sum) move into and out of each bucket ``value // bucket_size`` with ``source``'s
        staged batch, from its committed values; replaces what was staged. Returns the count.
        """
        keys = ", ".join(quote_ident(c) for c in source.keys)
        conn.execute(
            text(f"DELETE FROM {self.qstage} WHERE txid = :t AND attempt = :a"),
            {"t": txid, "a": attempt},
        )
        result = conn.execute(
            text(
                f"""
                WITH batch AS (
                    SELECT {keys}, sum(delta) AS delta FROM {source.qstage}
                    WHERE txid = :t AND attempt = :a GROUP BY {keys}
                ), moved AS (
                    SELECT s.value AS old, COALESCE(s.value, 0) + b.delta AS new
                    FROM batch b LEFT JOIN {source.qtable} s USING ({keys})
                ), moves AS (
                    SELECT floor(old::numeric / :size) AS bucket, -1 AS d FROM moved
                    WHERE old IS NOT NULL
                    UNION ALL
                    SELECT floor(new::numeric / :size), 1 FROM moved
                )
                INSERT INTO {self.qstage} (txid, attempt, bucket, delta)
                SELECT :t, :a, bucket, sum(d) FROM moves GROUP BY bucket HAVING sum(d) <> 0
                """
            ),
            {"t": txid, "a": attempt, "size": bucket_size},
        )
        return int(result.rowcount)

    # -- apply -----------------------------------------------------------------------------------

    def apply(
        self, conn: Connection, txid: int, attempt: int, *, summary_cte: str, summarised: str
    ) -> Row[Any]:
        """Fold ``(txid, attempt)``'s staged rows into the state table by the kind's rule and
        drop the staged rows of this txid and older ones: one statement, in a savepoint.

        ``summary_cte`` is a further CTE (after ``upsert`` and ``before``) and ``summarised``
        the SQL of whether it ran (:mod:`~airflow_txn_provider.state.summary`). Returns the row
        ``(keys, written, staged, summarised)``; a value out of its type's range raises
        :class:`~sqlalchemy.exc.DataError` (the savepoint rolled back).
        """
        combine, aggregate = COMBINERS[self.combiner]
        key_list = ", ".join(self.quoted_keys)
        staged_keys = ", ".join(quote_ident(c) for c in self.keys)
        select_keys = f"{staged_keys}, " if self.keys else "true AS singleton, "
        group_by = f"GROUP BY {staged_keys}" if self.keys else "HAVING count(*) > 0"
        vt = self.value_type
        rows = '"txn:rows"'  # no key column can be named so (keys are [a-z_][a-z0-9_]*)
        # A map's key count and value sum move by this batch's deltas, in this statement: the
        # CTE "before" reads the batch's keys as they were (one snapshot), "upsert" as they are.
        # The undo record is written from "before" too: the one read of the stored rows.
        returned = "".join(f"s.{k}, " for k in self.quoted_keys)
        batch_keys = ", ".join(f"b.{k}" for k in self.quoted_keys)
        old_values = ", ".join(f"s.{c} AS old_{c}" for c in self.row_columns)

        def comb(a: str, b: str) -> str:
            return combine.format(a=a, b=b)

        upsert = self.rule.upsert(comb, self.combiner)
        undo_cte = UndoRecords(self).cte(key_list) if self.undo else ""
        sql = f"""
            WITH batch AS (
                SELECT {select_keys}CAST({aggregate}(delta) AS {vt}) AS delta, count(*) AS {rows}
                FROM {self.qstage}
                WHERE txid = :txid AND attempt = :attempt
                {group_by}
            ), upsert AS (
                INSERT INTO {self.qtable} AS s ({key_list}, {upsert.columns})
                SELECT {key_list}, {upsert.values} FROM batch ORDER BY {key_list}
                ON CONFLICT ({key_list}) DO UPDATE SET {upsert.update} {upsert.guard}
                RETURNING {returned}s.value
            ), before AS (
                -- the statement's snapshot: the batch's keys as they were before this commit
                SELECT {batch_keys}, s.{self.quoted_keys[0]} IS NOT NULL AS existed, {old_values}
                FROM batch b LEFT JOIN {self.qtable} s USING ({key_list})
            ){undo_cte}, cleanup AS (
                DELETE FROM {self.qstage} WHERE txid <= :txid
            ){summary_cte}
            SELECT (SELECT count(*) FROM batch) AS keys,
                   (SELECT count(*) FROM upsert) AS written,
                   (SELECT coalesce(sum({rows}), 0) FROM batch) AS staged,
                   {summarised} AS summarised
        """
        # Aggregating and sorting a large batch in memory instead of spilling to disk (default 4MB).
        conn.execute(text("SELECT set_config('work_mem', '256MB', true)"))
        with conn.begin_nested():  # a savepoint: an overflow leaves the commit usable
            return conn.execute(
                text(sql), {"txid": txid, "attempt": attempt, "name": self.name}
            ).one()

    def out_of_range(self, conn: Connection, txid: int, attempt: int) -> tuple[str | None, Any]:
        """``(key, total)`` of the key the batch takes furthest from zero (``key`` as its repr;
        both ``None`` when the batch is empty): one aggregate over the batch and its stored
        values, for the error of an apply out of the value type's range."""
        keys = ", ".join(quote_ident(c) for c in self.keys)
        by = f"GROUP BY {keys}" if self.keys else ""
        select_keys = f"b.{', b.'.join(quote_ident(c) for c in self.keys)}" if self.keys else "1"
        joined = (
            f"LEFT JOIN {self.qtable} s USING ({keys})"
            if self.keys
            else (f"LEFT JOIN {self.qtable} s ON true")
        )
        found = conn.execute(
            text(
                f"""
                WITH b AS (
                    SELECT {keys + ", " if self.keys else ""}sum(delta::numeric) AS delta
                    FROM {self.qstage} WHERE txid = :t AND attempt = :a {by}
                )
                SELECT {select_keys}, coalesce(s.value::numeric, 0) + b.delta AS total
                FROM b {joined}
                ORDER BY abs(coalesce(s.value::numeric, 0) + b.delta) DESC LIMIT 1
                """
            ),
            {"t": txid, "a": attempt},
        ).first()
        key = None if found is None else repr(tuple(found)[:-1])
        total = None if found is None else found[-1]
        return key, total

    def newest_txid(self, conn: Connection) -> Any:
        """The greatest txid stored in the state table."""
        return conn.execute(text(f"SELECT max(txid) FROM {self.qtable}")).scalar_one()

    # -- read ------------------------------------------------------------------------------------

    def items(self, conn: Connection) -> dict[tuple[Any, ...], Any]:
        rows = conn.execute(text(f"SELECT {', '.join(self.quoted_keys)}, value FROM {self.qtable}"))
        return {tuple(r[:-1]): r[-1] for r in rows}

    def rows(self, conn: Connection) -> list[dict[str, Any]]:
        rows = conn.execute(
            text(f"SELECT * FROM {self.qtable} ORDER BY {', '.join(self.quoted_keys)}")
        )
        return [dict(r._mapping) for r in rows]

    def get(self, conn: Connection, keys: Sequence[Sequence[Any]]) -> dict[tuple[Any, ...], Any]:
        if not keys:
            return {}
        if not self.keys:
            return self.items(conn)
        cols = ", ".join(quote_ident(c) for c in self.keys)
        params: dict[str, Any] = {}
        tuples = []
        for i, key in enumerate(keys):
            names = []
            for j, value in enumerate(key):
                params[f"k{i}_{j}"] = value
                names.append(f":k{i}_{j}")
            tuples.append(f"({', '.join(names)})")
        sql = f"SELECT {cols}, value FROM {self.qtable} WHERE ({cols}) IN ({', '.join(tuples)})"
        return {tuple(r[:-1]): r[-1] for r in conn.execute(text(sql), params)}

    def value(self, conn: Connection) -> Any:
        """The single value of a global state's table."""
        return conn.execute(text(f"SELECT value FROM {self.qtable}")).scalar_one_or_none()
