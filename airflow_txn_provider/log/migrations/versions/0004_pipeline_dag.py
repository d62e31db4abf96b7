"""Which Airflow DAGs run each pipeline, so the Transactions page authorises a pipeline by the
DAG that really runs it (``build_dag(dag_id=…)`` may differ from the pipeline's name).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txn_pipeline_dag",
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            ondelete="CASCADE",
            name="fk_txn_pipeline_dag_pipeline_txn_pipeline",
        ),
        sa.PrimaryKeyConstraint("pipeline", "dag_id", name="pk_txn_pipeline_dag"),
    )


def downgrade() -> None:
    op.drop_table("txn_pipeline_dag")
