"""A lease on each processing attempt, so an attempt whose process died is noticed and replayed.

The process running a txid's processing renews ``lease_expires_at`` while it works; a watcher that
outlives it (the failure sensor's trigger) fails the attempt once the lease runs out, by the log's
clock. ``lease_holder`` names who renewed it last, for the error a person reads.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "txn_transaction",
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column("txn_transaction", sa.Column("lease_holder", sa.Text(), nullable=True))
    # An attempt processing while the library is upgraded gets the claim's lease (two minutes):
    # one whose process is gone is noticed then, not never (a NULL lease never runs out).
    op.execute(
        "UPDATE txn_transaction SET lease_expires_at = now() + interval '120 seconds' "
        "WHERE status = 'processing'"
    )


def downgrade() -> None:
    op.drop_column("txn_transaction", "lease_holder")
    op.drop_column("txn_transaction", "lease_expires_at")
