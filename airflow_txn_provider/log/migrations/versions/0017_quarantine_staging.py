"""Drops on the input batch and on lake sinks (issue 60): ``txn_quarantine_staging`` holds the
rows a Spark job took out for ``drop`` expectations, staged with the attempt's output in the same
transaction; the attempt's commit moves them to ``txn_quarantine`` (its verdict drops them), a
failed attempt's stay behind until its txid commits or is rewound.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txn_quarantine_staging",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("output", sa.String(250), nullable=False),
        sa.Column("txid", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("expectations", ARRAY(sa.Text), nullable=False),
        sa.Column("row", JSONB, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_txn_quarantine_staging")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            name=op.f("fk_txn_quarantine_staging_pipeline_txn_pipeline"),
            ondelete="CASCADE",
        ),
    )
    op.create_index(
        "ix_txn_quarantine_staging_txid", "txn_quarantine_staging", ["pipeline", "txid", "attempt"]
    )


def downgrade() -> None:
    op.drop_index("ix_txn_quarantine_staging_txid", table_name="txn_quarantine_staging")
    op.drop_table("txn_quarantine_staging")
