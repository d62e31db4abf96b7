"""Rewind: recomputing a pipeline from txid N (``TransactionLog.rewind``).

* ``txn_pipeline.undo_from_txid``: the first txid whose commit wrote undo records (each state's
  ``txn_undo_<name>``: a key's row as it was before the commit changed it). A rewind reaches no
  further back. A pipeline of an earlier version starts at its next txid; a new one at txid 1.
* ``txn_rewind``: one row per rewind: who, when, to which txid, from which last committed txid,
  with which job version and why.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "txn_pipeline",
        sa.Column("undo_from_txid", sa.BigInteger, nullable=False, server_default="1"),
    )
    # the txids committed before this version wrote no undo records
    op.execute("UPDATE txn_pipeline SET undo_from_txid = last_committed_txid + 1")
    op.create_table(
        "txn_rewind",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("to_txid", sa.BigInteger, nullable=False),
        sa.Column("last_committed_txid", sa.BigInteger, nullable=False),
        sa.Column("rewound_txids", sa.BigInteger, nullable=False),
        sa.Column("by", sa.Text, nullable=False),
        sa.Column("job_version", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("states", sa.dialects.postgresql.JSONB, nullable=True),
        sa.Column(
            "rewound_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_txn_rewind")),
        sa.ForeignKeyConstraint(
            ["pipeline"],
            ["txn_pipeline.name"],
            name=op.f("fk_txn_rewind_pipeline_txn_pipeline"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("to_txid >= 1", name=op.f("ck_txn_rewind_to_txid")),
    )


def downgrade() -> None:
    op.drop_table("txn_rewind")
    op.drop_column("txn_pipeline", "undo_from_txid")
