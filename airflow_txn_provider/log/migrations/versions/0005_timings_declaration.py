"""Where each attempt's time went, and each pipeline's declaration fingerprint.

* ``txn_attempt.timings``: seconds the attempt spent in its phases (Spark, staging, commit, ...),
  reported by the processing job and the commit; the Transactions page and ``make bench-peer``
  show them.
* ``txn_pipeline.declaration``: a fingerprint of what the pipeline was last registered with
  (source kind, max_pending, DAG, states): a begin whose declaration matches skips registration
  and state DDL (one read instead of an advisory lock and DDL per begin).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_attempt", sa.Column("timings", JSONB, nullable=True))
    op.add_column("txn_pipeline", sa.Column("declaration", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("txn_pipeline", "declaration")
    op.drop_column("txn_attempt", "timings")
