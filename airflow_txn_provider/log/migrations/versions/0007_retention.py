"""Retention of the log, and state summaries kept by the commit.

* ``txn_pipeline.keep_txids``: how many of the newest committed txids keep their rows in
  ``txn_transaction`` and ``txn_attempt``; older ones are deleted by the commit, a bounded batch at
  a time, and folded into the pipeline's totals: ``pruned_txids``, ``pruned_attempts``,
  ``pruned_failed_attempts`` and ``pruned_through_txid`` (every txid up to it was pruned).
* ``txn_map_summary``: per map state, its number of keys and the sum of its values, updated with
  the deltas of each commit in the commit's own transaction: the Transactions page reads them
  instead of scanning the state table.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DEFAULT_KEEP_TXIDS = 1000


def upgrade() -> None:
    op.add_column(
        "txn_pipeline",
        sa.Column("keep_txids", sa.Integer, nullable=False, server_default=str(DEFAULT_KEEP_TXIDS)),
    )
    for column in (
        "pruned_txids",
        "pruned_attempts",
        "pruned_failed_attempts",
        "pruned_through_txid",
    ):
        op.add_column(
            "txn_pipeline", sa.Column(column, sa.BigInteger, nullable=False, server_default="0")
        )
    op.create_check_constraint(
        op.f("ck_txn_pipeline_keep_txids"), "txn_pipeline", "keep_txids >= 1"
    )
    op.create_table(
        "txn_map_summary",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("keys", sa.BigInteger, nullable=False),
        sa.Column("total", sa.Numeric, nullable=False),
        sa.Column("txid", sa.BigInteger, nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_txn_map_summary")),
        sa.ForeignKeyConstraint(
            ["name"],
            ["txn_state_registry.name"],
            name=op.f("fk_txn_map_summary_name_txn_state_registry"),
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("txn_map_summary")
    op.drop_constraint(op.f("ck_txn_pipeline_keep_txids"), "txn_pipeline", type_="check")
    for column in (
        "pruned_through_txid",
        "pruned_failed_attempts",
        "pruned_attempts",
        "pruned_txids",
        "keep_txids",
    ):
        op.drop_column("txn_pipeline", column)
