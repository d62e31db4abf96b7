"""Record the failure sensor's response to each failed attempt (``txn_attempt.response``).

A txid's own failures count toward ``max_attempts`` from the log, not from a sensor's memory: an
Airflow retry of a failure sensor (its deferral lost to a supervisor or triggerer crash) would
otherwise start counting again and replay a poison batch once more than allowed. The response
also makes the sensor's work idempotent: a retried sensor sees the failure was answered already
and only keeps watching. ``stop`` marks where the pipeline stopped at a poison batch; a person's
rerun after it starts a new count.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("txn_attempt", sa.Column("response", sa.String(20), nullable=True))
    op.create_check_constraint(
        op.f("ck_txn_attempt_response"),
        "txn_attempt",
        "response IN ('requeue', 'leave_to_origin', 'stop')",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_txn_attempt_response"), "txn_attempt", type_="check")
    op.drop_column("txn_attempt", "response")
