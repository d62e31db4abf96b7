"""``txn_source_names``: the names of each file source partition's files (those of
``txn_source_file``) in a few newline-separated values, what a begin compares a folder's listing
with: a few values read where a row per file was aggregated (issue 58, ``make bench-begin``).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txn_source_names",
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("partition", sa.Text, nullable=False),
        sa.Column("segment", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("names", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("source", "partition", "segment", name=op.f("pk_txn_source_names")),
    )
    # Uncompressed: read whole by every listing of the partition (no decompression).
    op.execute("ALTER TABLE txn_source_names ALTER COLUMN names SET STORAGE EXTERNAL")
    op.execute(
        "INSERT INTO txn_source_names (source, partition, names)"
        " SELECT source, partition, string_agg(name, E'\\n') FROM txn_source_file"
        " GROUP BY source, partition"
    )


def downgrade() -> None:
    op.drop_table("txn_source_names")
