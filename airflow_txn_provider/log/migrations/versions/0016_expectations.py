"""Audit before publish (issue 60): ``txn_attempt`` gains ``expectations``, each declared
expectation's outcome for the attempt (what it checked, failed and did), and
``txn_quarantine`` holds the rows a ``drop`` expectation took out of a txid's output, stamped
with pipeline, output, txid and attempt (:mod:`airflow_txn_provider.transactions.audit`).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_attempt", sa.Column("expectations", JSONB, nullable=True))
    op.create_table(
        "txn_quarantine",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("output", sa.String(250), nullable=False),
        sa.Column("txid", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("expectations", ARRAY(sa.Text), nullable=False),
        sa.Column("row", JSONB, nullable=False),
        sa.Column(
            "quarantined_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_txn_quarantine")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            name=op.f("fk_txn_quarantine_pipeline_txn_pipeline"),
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_txn_quarantine_txid", "txn_quarantine", ["pipeline", "txid"])


def downgrade() -> None:
    op.drop_index("ix_txn_quarantine_txid", table_name="txn_quarantine")
    op.drop_table("txn_quarantine")
    op.drop_column("txn_attempt", "expectations")
