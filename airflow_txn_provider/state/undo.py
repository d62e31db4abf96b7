"""A state's undo records: what a rewind restores from
(:mod:`airflow_txn_provider.transactions.rewind`).

Each commit's apply statement writes, for each state, ONE row into ``txn_undo_<state>``: the
batch's keys and each key's row as it was before the commit (``existed`` false: the key was new),
as parallel arrays. A rewind to txid N puts back, for every key the commits from N on touched,
the row before the first of them. Retention deletes the records with the txids it prunes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.state.backing import BackingTable

UNDO_COMPRESSION = "COMPRESSION lz4"
"""How the undo records' arrays are compressed: lz4 (Postgres 14+, built with it, as Debian's
and the official images are), which costs the commit far less CPU than the default pglz."""


@dataclass(frozen=True)
class UndoRecords:
    """The undo table of one state's :class:`~airflow_txn_provider.state.backing.BackingTable`."""

    table: BackingTable

    def create(self, conn: Connection) -> None:
        """The undo table, if missing: one row per committed txid, holding its batch's keys and
        each key's row as it was before the commit (``existed`` false: the key was new), as
        parallel arrays. One row a commit, not one a key: a row of arrays (compressed, out of
        line) costs the commit far less than a row per key.
        Logged, like the state: a rewind after a crash needs it."""
        t = self.table
        keys = zip(t.quoted_keys, t.key_types(), strict=True)
        old = t.row_ddl()
        arrays = [
            *(f"{k} {typ}[] {UNDO_COMPRESSION} NOT NULL" for k, typ in keys),
            f"existed boolean[] {UNDO_COMPRESSION} NOT NULL",
            *(f"old_{c} {typ}[] {UNDO_COMPRESSION}" for c, typ in old),
        ]
        cols = ["txid bigint PRIMARY KEY", *arrays]
        conn.execute(text(f"CREATE TABLE IF NOT EXISTS {t.qundo} ({', '.join(cols)})"))

    def cte(self, key_list: str) -> str:
        """The apply statement's CTE that writes the txid's undo record: the batch's keys and
        their rows as they were (``before``), one array per column, for a rewind."""
        t = self.table
        columns = ["existed", *(f"old_{c}" for c in t.row_columns)]
        aggregated = ", ".join(f"array_agg({c})" for c in [*t.quoted_keys, *columns])
        return f""", undo AS (
                INSERT INTO {t.qundo} (txid, {key_list}, {", ".join(columns)})
                SELECT CAST(:txid AS bigint), {aggregated} FROM before HAVING count(*) > 0
                -- applied again (a state used outside the log): the rows before the first time
                ON CONFLICT (txid) DO NOTHING
            )"""

    def rewind(self, conn: Connection, to_txid: int) -> tuple[int, int]:
        """Put back every key the commits of ``to_txid`` and later changed as it was before
        ``to_txid``'s: the undo record of the first of them that changed it holds that row (a
        key it made is deleted). Their undo records and staged rows go too. One statement, in
        the caller's transaction. Returns ``(keys restored, keys removed)``."""
        t = self.table
        keys = ", ".join(t.quoted_keys)
        columns = [*t.quoted_keys, "existed", *(f"old_{c}" for c in t.row_columns)]
        unnested = ", ".join(f"u.{c}" for c in columns)
        match = " AND ".join(f"s.{k} = f.{k}" for k in t.quoted_keys)
        restore = ", ".join(f"{c} = f.old_{c}" for c in t.row_columns)
        row = conn.execute(
            text(
                f"""
                WITH undone AS (
                    SELECT u.txid, k.* FROM {t.qundo} u
                    CROSS JOIN LATERAL unnest({unnested}) AS k({", ".join(columns)})
                    WHERE u.txid >= :n
                ), first AS (
                    SELECT DISTINCT ON ({keys}) * FROM undone ORDER BY {keys}, txid
                ), removed AS (
                    DELETE FROM {t.qtable} s USING first f WHERE {match} AND NOT f.existed
                    RETURNING 1
                ), restored AS (
                    UPDATE {t.qtable} s SET {restore} FROM first f WHERE {match} AND f.existed
                    RETURNING 1
                ), undone_records AS (
                    DELETE FROM {t.qundo} WHERE txid >= :n
                ), unstaged AS (
                    DELETE FROM {t.qstage} WHERE txid >= :n
                )
                SELECT (SELECT count(*) FROM restored) AS restored,
                       (SELECT count(*) FROM removed) AS removed
                """
            ),
            {"n": to_txid},
        ).one()
        return int(row.restored), int(row.removed)

    def prune(self, conn: Connection, through_txid: int) -> None:
        """Drop the undo records of txids up to ``through_txid`` (retention pruned them)."""
        t = self.table
        conn.execute(text(f"DELETE FROM {t.qundo} WHERE txid <= :t"), {"t": through_txid})


__all__ = ["UNDO_COMPRESSION", "UndoRecords"]
