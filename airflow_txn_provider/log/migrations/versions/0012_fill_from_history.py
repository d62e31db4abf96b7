"""Fill from history: an output declared with ``start={name: "history"}`` is computed over the
committed txids by a fill beside the live pipeline (:mod:`airflow_txn_provider.rules.filling`).
``txn_output`` gains its progress:

* ``live_from_txid``: the first txid begun after the declaration, whose processing stages the
  output (the fill may apply those staged rows instead of computing them again);
* ``filled_through``: the newest txid the fill applied to it, in order (0: none yet);
* ``fill_attempt``: the fill's fencing token, raised by every fill process that takes over;
* ``joined_after_txid``: the last committed txid when it joined the live commits (``NULL``
  while it fills).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

CHECK = "ck_txn_output_start"


def upgrade() -> None:
    op.add_column("txn_output", sa.Column("live_from_txid", sa.BigInteger, nullable=True))
    op.add_column("txn_output", sa.Column("filled_through", sa.BigInteger, nullable=True))
    op.add_column(
        "txn_output",
        sa.Column("fill_attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.add_column("txn_output", sa.Column("joined_after_txid", sa.BigInteger, nullable=True))
    op.drop_constraint(op.f(CHECK), "txn_output", type_="check")
    op.create_check_constraint(op.f(CHECK), "txn_output", "start IN ('next_txid', 'history')")


def downgrade() -> None:
    op.drop_constraint(op.f(CHECK), "txn_output", type_="check")
    op.create_check_constraint(op.f(CHECK), "txn_output", "start IN ('next_txid')")
    for column in ("joined_after_txid", "fill_attempt", "filled_through", "live_from_txid"):
        op.drop_column("txn_output", column)
