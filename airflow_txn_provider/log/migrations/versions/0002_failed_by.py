"""Record which txid a failure came from (``failed_by``), so a cascade is told from its origin.

A failure of txid k fails k and every later txid in flight. Until now only the error text said
"failed with txid k"; the failure sensor's retry budget and the UI's "blocked by" need it as data.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_transaction", sa.Column("failed_by", sa.BigInteger(), nullable=True))
    op.add_column("txn_attempt", sa.Column("failed_by", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("txn_attempt", "failed_by")
    op.drop_column("txn_transaction", "failed_by")
