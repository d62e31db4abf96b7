"""The summary of a keyed map state in ``txn_map_summary``: its key count and value sum, kept by
each commit, and its top keys.

The Transactions page shows them for every state; counting a large table at each page load
would scan it, so the commit that moves them keeps them, in its apply statement
(:meth:`~airflow_txn_provider.state.backing.BackingTable.apply`). A global state has no summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, text

from airflow_txn_provider.log.models import MAP_SUMMARY

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.state.backing import BackingTable

UPKEEP_CTE = """, summary AS (
                UPDATE txn_map_summary SET
                    keys = keys + (SELECT count(*) FROM upsert)
                                - (SELECT count(*) FROM before WHERE existed),
                    total = total + (SELECT coalesce(sum(value), 0) FROM upsert)
                                  - (SELECT coalesce(sum(old_value), 0) FROM before),
                    txid = :txid, updated_at = now()
                WHERE name = :name
                RETURNING 1
            )"""
"""The apply statement's CTE that moves the summary by the batch: ``upsert`` holds the batch's
keys as they are, ``before`` as they were (one snapshot: ``existed``, ``old_value``)."""


def summary_upkeep_cte(keyed: bool) -> tuple[str, str]:
    """``(CTE, whether it updated a row)`` for the apply statement of a state, keyed or not
    (``("", "true")``: nothing to keep)."""
    if not keyed:
        return "", "true"
    return UPKEEP_CTE, "EXISTS (SELECT 1 FROM summary)"


def start_summary(conn: Connection, name: str, *, fresh: bool) -> None:
    """The summary row (keys, sum) each commit keeps (see :meth:`MapState.apply`).

    A table created just now starts a summary of its own (one left by a dropped table of the
    same name is stale); an existing one without a summary (created by an earlier version)
    gets one on its next commit. No index on the value: it would make every update of a key
    a non-HOT update (docs/ui.md), on the commit path that runs one txid at a time; the page's
    top keys are a scan, rate-limited."""
    if fresh:
        conn.execute(delete(MAP_SUMMARY).where(MAP_SUMMARY.c.name == name))


def count_summary_once(conn: Connection, name: str, table: BackingTable, txid: int) -> None:
    """Count the summary from the table: a state of an earlier version that has none yet."""
    conn.execute(
        text(
            "INSERT INTO txn_map_summary (name, keys, total, txid) "
            f"SELECT :name, count(*), coalesce(sum(value), 0), :txid FROM {table.qtable} "
            "ON CONFLICT (name) DO UPDATE SET keys = EXCLUDED.keys, "
            "total = EXCLUDED.total, txid = EXCLUDED.txid, updated_at = now()"
        ),
        {"name": name, "txid": txid},
    )


def read_summary(conn: Connection, name: str) -> tuple[int, Any] | None:
    """``(keys, sum of values)`` as the commits kept them (``None``: none kept yet)."""
    row = conn.execute(
        select(MAP_SUMMARY.c["keys"], MAP_SUMMARY.c.total).where(MAP_SUMMARY.c.name == name)
    ).one_or_none()
    return None if row is None else (int(row.keys), row.total)


def top_keys(conn: Connection, table: BackingTable, k: int) -> list[tuple[Any, ...]]:
    """The ``k`` keys with the largest values, ``(keys…, value)``, largest first (ties by key):
    one scan of the table with a top-``k`` sort."""
    columns = ", ".join(table.quoted_keys)
    rows = conn.execute(
        text(
            f"SELECT {columns}, value FROM {table.qtable} WHERE value IS NOT NULL "
            f"ORDER BY value DESC, {columns} LIMIT :n"
        ),
        {"n": k},
    )
    return [tuple(r) for r in rows]
