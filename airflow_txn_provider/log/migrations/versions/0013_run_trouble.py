"""Run trouble: ``txn_pipeline`` gains ``run_trouble`` and ``run_trouble_since``, what the
pipeline's waker could not mend in Airflow (a due txid whose run cannot be created: another run
holds its logical date) and since when. The health endpoint reports a pipeline with trouble older
than a grace as stalled (:mod:`airflow_txn_provider.log.health`).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_pipeline", sa.Column("run_trouble", sa.Text, nullable=True))
    op.add_column(
        "txn_pipeline", sa.Column("run_trouble_since", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("txn_pipeline", "run_trouble_since")
    op.drop_column("txn_pipeline", "run_trouble")
