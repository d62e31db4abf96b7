"""Runs made ahead: ``txn_pipeline`` gains ``runs_made_through``, the newest txid whose DAG run a
claim made ahead of its begin (:func:`airflow_txn_provider.rules.waiting.runs_to_make`). A hint,
never trusted for correctness: the next claim makes only the runs above it, and the waker asks
for a run below it only once it has waited for its begin a while.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "txn_pipeline",
        sa.Column("runs_made_through", sa.BigInteger, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("txn_pipeline", "runs_made_through")
