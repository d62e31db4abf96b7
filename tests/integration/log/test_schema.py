"""The migrations and the models agree (``log/schema.py`` applies the one, queries use the other):
a database migrated to the head has exactly the models' tables, columns and indexes."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from airflow_txn_provider.log.models import Base


def test_a_migrated_log_has_exactly_the_models_tables_columns_and_indexes(db_url):
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": False, "include_name": _ours}
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert [d for d in diff if not _known(d)] == [], diff


KNOWN_NULLABLE = {
    ("txn_attempt", "started_at"),
    ("txn_pipeline", "created_at"),
    ("txn_pipeline", "updated_at"),
    ("txn_state_registry", "created_at"),
    ("txn_transaction", "updated_at"),
}
"""Timestamps the first migrations left nullable with a ``now()`` default (every writer sets
them): the models type them as always set. Known, so that any other difference fails."""


def _known(diff) -> bool:
    changes = diff if isinstance(diff, list) else [diff]
    return all(c[0] == "modify_nullable" and (c[2], c[3]) in KNOWN_NULLABLE for c in changes)


def _ours(name, type_, parent_names):
    """The log's own tables (``txn_*``), not the states' (created per state) nor Alembic's."""
    return type_ != "table" or (name.startswith("txn_") and name != "txn_alembic_version")
