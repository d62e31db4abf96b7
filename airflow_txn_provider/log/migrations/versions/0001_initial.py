"""Initial transaction log: pipelines, transactions, attempt history, state registry.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUS_CHECK = "status IN ('processing', 'processed', 'committed', 'failed')"


def upgrade() -> None:
    op.create_table(
        "txn_pipeline",
        sa.Column("name", sa.String(250), nullable=False),
        sa.Column("source_kind", sa.String(20), nullable=False),
        sa.Column("max_pending", sa.Integer(), nullable=False),
        sa.Column("last_committed_txid", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_txn_pipeline")),
        sa.CheckConstraint(
            "source_kind IN ('transactional', 'opaque')", name=op.f("ck_txn_pipeline_source_kind")
        ),
        sa.CheckConstraint("max_pending >= 1", name=op.f("ck_txn_pipeline_max_pending")),
        sa.CheckConstraint(
            "last_committed_txid >= 0", name=op.f("ck_txn_pipeline_last_committed_txid")
        ),
    )
    op.create_table(
        "txn_transaction",
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("metadata", JSONB(), nullable=True),
        sa.Column("output", JSONB(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("begun_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("pipeline", "txid", name=op.f("pk_txn_transaction")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            name=op.f("fk_txn_transaction_pipeline_txn_pipeline"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("txid >= 1", name=op.f("ck_txn_transaction_txid")),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_txn_transaction_attempt")),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_txn_transaction_status")),
    )
    op.create_table(
        "txn_attempt",
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("metadata", JSONB(), nullable=True),
        sa.Column("output", JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("pipeline", "txid", "attempt", name=op.f("pk_txn_attempt")),
        sa.ForeignKeyConstraint(
            ["pipeline", "txid"],
            ["txn_transaction.pipeline", "txn_transaction.txid"],
            name=op.f("fk_txn_attempt_pipeline_txn_transaction"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_txn_attempt_status")),
    )
    op.create_table(
        "txn_state_registry",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("definition", JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_txn_state_registry")),
        sa.CheckConstraint(
            "kind IN ('non_transactional', 'transactional', 'opaque')",
            name=op.f("ck_txn_state_registry_kind"),
        ),
    )


def downgrade() -> None:
    op.drop_table("txn_state_registry")
    op.drop_table("txn_attempt")
    op.drop_table("txn_transaction")
    op.drop_table("txn_pipeline")
