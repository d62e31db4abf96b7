"""Outputs: ``txn_output``, one row per output (state or lake sink) of a pipeline
(:mod:`airflow_txn_provider.log.outputs`): from which txid it is complete, the declaration's start
choice, and once retired, after which txid and whether its tables were kept or dropped.

The outputs an earlier version declared are filled in from what the log shows, exact or not at
all: complete from txid 1 where the log proves it, else ``NULL`` ("not recorded"), since that
version created an output added to a running pipeline empty and said nothing.

* a state: from txid 1 if it was registered before any txid of its pipeline began and nothing
  was pruned (pruned txids' start times are gone);
* a lake sink (known only from the txids' recorded outputs, ``lake:<name>``): from txid 1 if
  txid 1's output names it and nothing was pruned.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

KINDS = "kind IN ('state', 'lake_sink')"
STARTS = "start IN ('next_txid')"
RETIREMENTS = "retirement IN ('keep', 'drop')"


def upgrade() -> None:
    op.create_table(
        "txn_output",
        sa.Column("pipeline", sa.String(250), nullable=False),
        sa.Column("name", sa.String(250), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("start", sa.String(20), nullable=True),
        sa.Column("complete_from_txid", sa.BigInteger, nullable=True),
        sa.Column(
            "declared_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retired_after_txid", sa.BigInteger, nullable=True),
        sa.Column("retirement", sa.String(20), nullable=True),
        sa.PrimaryKeyConstraint("pipeline", "name", name=op.f("pk_txn_output")),
        sa.CheckConstraint(KINDS, name=op.f("ck_txn_output_kind")),
        sa.CheckConstraint(STARTS, name=op.f("ck_txn_output_start")),
        sa.CheckConstraint(RETIREMENTS, name=op.f("ck_txn_output_retirement")),
        sa.CheckConstraint(
            "complete_from_txid >= 1", name=op.f("ck_txn_output_complete_from_txid")
        ),
    )
    op.execute(
        """
        INSERT INTO txn_output (pipeline, name, kind, complete_from_txid, declared_at)
        SELECT r.pipeline, r.name, 'state',
               CASE WHEN COALESCE(p.pruned_txids, 0) = 0 AND NOT EXISTS (
                   SELECT 1 FROM txn_attempt a
                   WHERE a.pipeline = r.pipeline AND a.started_at < r.created_at
               ) THEN 1 END,
               r.created_at
        FROM txn_state_registry r LEFT JOIN txn_pipeline p ON p.name = r.pipeline
        """
    )
    op.execute(
        """
        INSERT INTO txn_output (pipeline, name, kind, complete_from_txid)
        SELECT DISTINCT t.pipeline, substr(k.key, 6), 'lake_sink',
               CASE WHEN p.pruned_txids = 0 AND EXISTS (
                   SELECT 1 FROM txn_transaction t1
                   WHERE t1.pipeline = t.pipeline AND t1.txid = 1
                     AND jsonb_typeof(t1.output) = 'object' AND t1.output ? k.key
               ) THEN 1 END
        FROM txn_transaction t
        JOIN txn_pipeline p ON p.name = t.pipeline
        CROSS JOIN LATERAL jsonb_object_keys(
            CASE WHEN jsonb_typeof(t.output) = 'object' THEN t.output ELSE '{}'::jsonb END
        ) AS k(key)
        WHERE k.key LIKE 'lake:%'
        ON CONFLICT DO NOTHING
        """
    )


def downgrade() -> None:
    op.drop_table("txn_output")
