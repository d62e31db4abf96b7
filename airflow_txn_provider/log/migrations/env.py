"""Alembic environment of the transaction log.

Run programmatically by :func:`airflow_txn_provider.log.schema.upgrade`, which passes an open
connection in ``config.attributes["connection"]``. The version table is ``txn_alembic_version`` so
the log can share a database with Airflow's own metadata (which uses ``alembic_version``).
"""

from __future__ import annotations

from alembic import context

from airflow_txn_provider.log.models import Base
from airflow_txn_provider.log.schema import VERSION_TABLE

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the alembic CLI
    raise RuntimeError(
        "run migrations with airflow_txn_provider.log.schema.upgrade(engine), not the alembic CLI"
    )

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
