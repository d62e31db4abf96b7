"""What each job of an attempt staged, recorded in a logged row.

* ``txn_attempt.staged``: ``{job: {output key: rows}}``, written by ``TransactionLog.stage`` in
  the same database transaction as the job's COPY into the (UNLOGGED) staging tables. A Postgres
  crash recovery, or a promoted standby, empties UNLOGGED tables without a trace and without
  moving ``pg_postmaster_start_time()``: recording the processed output of a txid staged by
  several jobs compares these counts with what the staging tables hold, by content.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_attempt", sa.Column("staged", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("txn_attempt", "staged")
