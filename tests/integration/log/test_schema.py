"""The migrations and the models agree (``log/schema.py`` applies the one, queries use the other):
a database migrated to the head has exactly the models' tables, columns and indexes; a migration
that moves data moves it exactly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from airflow_txn_provider.log.models import Base
from airflow_txn_provider.log.schema import upgrade
from tests.conftest import new_database


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


def test_0018_gives_each_source_partition_the_names_of_its_files(postgres):
    """A catalog written before 0018 (a row per file) gets each partition's names as one value."""
    engine = create_engine(new_database(postgres, migrated=False))
    files = {("s", "0"): ["a.parquet", "sub/b.parquet"], ("s", "1"): ["é"], ("t", "0"): ["c"]}
    try:
        upgrade(engine, "0017")
        with engine.begin() as conn:
            for (s, p), names in files.items():
                for n in names:
                    conn.execute(
                        text("INSERT INTO txn_source_file VALUES (:s, :p, :n, 1, 1, 0, 0)"),
                        {"s": s, "p": p, "n": n},
                    )
        upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT source, partition, names FROM txn_source_names"))
            got = {(s, p): sorted(names.split("\n")) for s, p, names in rows}
    finally:
        engine.dispose()
    assert got == {key: sorted(names) for key, names in files.items()}


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
