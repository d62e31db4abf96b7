"""The file sources' catalog: ``txn_source_partition`` (each partition's folders at their last
listing, its end and newest files) and ``txn_source_file`` (each file's offset range), what
discovery found, shared by every host (:mod:`airflow_txn_provider.sources.catalog`). It replaces
the index files each machine kept under its temp dir.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txn_source_partition",
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("partition", sa.Text, nullable=False),
        sa.Column("folders", JSONB, nullable=False),
        sa.Column("end_offset", sa.BigInteger, nullable=False),
        sa.Column("newest", JSONB, nullable=False),
        sa.PrimaryKeyConstraint("source", "partition", name=op.f("pk_txn_source_partition")),
    )
    op.create_table(
        "txn_source_file",
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("partition", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("mtime_ns", sa.BigInteger, nullable=False),
        sa.Column("first_offset", sa.BigInteger, nullable=False),
        sa.Column("last_offset", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("source", "partition", "name", name=op.f("pk_txn_source_file")),
    )
    op.create_index(
        "ix_txn_source_file_last", "txn_source_file", ["source", "partition", "last_offset"]
    )


def downgrade() -> None:
    op.drop_index("ix_txn_source_file_last", table_name="txn_source_file")
    op.drop_table("txn_source_file")
    op.drop_table("txn_source_partition")
