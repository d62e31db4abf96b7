"""Alerts: ``txn_alert``, one row per alert the pipeline's notifiers were sent
(:mod:`airflow_txn_provider.log.alerts`): which pipeline, what (``poisoned``, ``stalled``), about
what (its key), when, and the message. Its primary key makes each alert go out once.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txn_alert",
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("pipeline", "kind", "key", name=op.f("pk_txn_alert")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            name=op.f("fk_txn_alert_pipeline_txn_pipeline"),
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("txn_alert")
