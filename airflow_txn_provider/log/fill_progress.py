"""The rows of a fill from history (``txn_output``'s fill columns, migration 0012): who fills an
output (its fencing token), how far it got, when it joined. The rules are
:mod:`airflow_txn_provider.rules.filling`'s; the fill itself is
:mod:`airflow_txn_provider.transactions.fill`.

Every write is fenced: a fill process takes the output over (:func:`take_over` raises its
attempt), and each of its steps locks the output's row and checks that its attempt is still the
current one and that the progress is where it left it (:func:`lock_fill`). A fill that was taken
over, or whose progress a rewind moved back, finds out there and starts again from the row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from airflow_txn_provider.log.models import OUTPUTS
from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.rules.filling import FillProgress, retention_floor, rewound_progress
from airflow_txn_provider.rules.outputs import OutputRecord
from airflow_txn_provider.rules.vocabulary import OutputStart

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)


def _row(pipeline: str, output: str):  # the output's row, as a WHERE clause
    return (OUTPUTS.c.pipeline == pipeline) & (OUTPUTS.c.name == output)


def filling_outputs(conn: Connection, pipeline: str) -> dict[str, OutputRecord]:
    """The outputs of ``pipeline`` that fill from history now (not joined, not retired)."""
    return {n: r for n, r in read_outputs(conn, pipeline).items() if r.filling}


def take_over(conn: Connection, pipeline: str, output: str) -> FillProgress | None:
    """Become the output's fill: raise its fencing token and return the progress it holds with
    the new token (``None``: it does not fill, or joined already). An older fill of it stops at
    its next step."""
    row = conn.execute(
        update(OUTPUTS)
        .where(
            _row(pipeline, output)
            & (OUTPUTS.c.start == OutputStart.HISTORY)
            & OUTPUTS.c.joined_after_txid.is_(None)
            & OUTPUTS.c.retired_at.is_(None)
            & OUTPUTS.c.live_from_txid.is_not(None)
        )
        .values(fill_attempt=OUTPUTS.c.fill_attempt + 1)
        .returning(OUTPUTS.c.live_from_txid, OUTPUTS.c.filled_through, OUTPUTS.c.fill_attempt)
    ).first()
    if row is None:
        return None
    return FillProgress(
        output, int(row.live_from_txid), int(row.filled_through or 0), int(row.fill_attempt)
    )


def lock_fill(conn: Connection, pipeline: str, mine: FillProgress) -> FillProgress | None:
    """Lock the output's row until ``conn``'s transaction ends and return its progress, if it is
    still ``mine`` (same token, same ``filled_through``); ``None`` otherwise: taken over, joined,
    retired, or moved back by a rewind."""
    row = conn.execute(
        select(
            OUTPUTS.c.live_from_txid,
            OUTPUTS.c.filled_through,
            OUTPUTS.c.fill_attempt,
            OUTPUTS.c.joined_after_txid,
            OUTPUTS.c.retired_at,
        )
        .where(_row(pipeline, mine.output))
        .with_for_update()
    ).first()
    if (
        row is None
        or row.retired_at is not None
        or row.joined_after_txid is not None
        or int(row.fill_attempt) != mine.attempt
        or int(row.filled_through or 0) != mine.filled_through
    ):
        return None
    return mine


def advance(conn: Connection, pipeline: str, mine: FillProgress, through: int) -> FillProgress:
    """Record that the fill applied every txid up to ``through`` (its row locked by
    :func:`lock_fill` in this transaction)."""
    conn.execute(update(OUTPUTS).where(_row(pipeline, mine.output)).values(filled_through=through))
    return FillProgress(mine.output, mine.live_from, through, mine.attempt)


def join(conn: Connection, pipeline: str, mine: FillProgress, last_committed: int) -> None:
    """Record the join: from the commit after ``last_committed`` on, the live commits apply the
    output (under the pipeline's lock, which the caller holds)."""
    conn.execute(
        update(OUTPUTS)
        .where(_row(pipeline, mine.output))
        .values(filled_through=last_committed, joined_after_txid=last_committed)
    )
    log.warning(
        "pipeline=%s output %s filled from history joined the live commits after txid %s",
        pipeline,
        mine.output,
        last_committed,
    )


def fill_floor(conn: Connection, pipeline: str) -> int | None:
    """The oldest txid a filling output of ``pipeline`` still needs (retention keeps it and every
    later txid), or ``None``."""
    fills = [r.fill for r in filling_outputs(conn, pipeline).values()]
    return retention_floor(f for f in fills if f is not None)


def rewind_fills(conn: Connection, pipeline: str, to_txid: int) -> dict[str, int]:
    """Take every filling output's progress back to ``to_txid - 1`` where it went further (in
    the rewind's transaction, which takes their values back with the other states'): returns the
    outputs moved, with their new progress."""
    moved: dict[str, int] = {}
    for name, rec in filling_outputs(conn, pipeline).items():
        fill = rec.fill
        if fill is None:
            continue
        back = rewound_progress(fill, to_txid)
        if back.filled_through != fill.filled_through:
            conn.execute(
                update(OUTPUTS)
                .where(_row(pipeline, name))
                .values(filled_through=back.filled_through)
            )
            moved[name] = back.filled_through
    return moved


__all__ = [
    "advance",
    "fill_floor",
    "filling_outputs",
    "join",
    "lock_fill",
    "rewind_fills",
    "take_over",
]
