"""What the Transactions page says about a rewind: on which txids it offers "Rewind to here",
what its confirmation says will be recomputed, how far back a rewind reaches, and whether the
user may do it. Pure (no I/O); the rule itself is the coordinator's
(:func:`~airflow_txn_provider.rules.history.plan_rewind`)."""

from __future__ import annotations

from typing import Any

from airflow_txn_provider.rules.exceptions import RewindError
from airflow_txn_provider.rules.history import plan_rewind
from airflow_txn_provider.rules.records import PipelineView


def txid_span(first: int, last: int) -> str:
    """``txid 5``, or ``txids 5 … 9``."""
    return f"txid {first}" if first == last else f"txids {first} … {last}"


def rewind_option(view: PipelineView, floor: int, txid: int) -> dict[str, Any] | None:
    """What "Rewind to here" on ``txid`` recomputes, in the words its confirmation shows; ``None``
    where the coordinator's rule (:func:`~airflow_txn_provider.rules.history.plan_rewind`, with
    ``floor`` from :func:`~airflow_txn_provider.rules.history.rewind_floor`) refuses a rewind to it,
    or nothing from it on has begun. The page offers the action on those txids only; the endpoint
    plans again when it is confirmed (the pipeline moves on meanwhile)."""
    try:
        plan = plan_rewind(view, txid, floor=floor)
    except RewindError:
        return None
    if not plan.failed:
        return None
    through = plan.failed[-1]
    undone, rerun = plan.rolled_back, plan.failed[len(plan.rolled_back) :]
    parts = []
    if undone:
        parts.append(f"the commits of {txid_span(undone[0], undone[-1])} are undone")
    if rerun:
        parts.append(
            f"{txid_span(rerun[0], rerun[-1])}, in flight, start{'s' * (len(rerun) == 1)} over"
        )
    before = f"after txid {txid - 1}" if txid > 1 else "before txid 1 (none)"
    return {
        "to_txid": txid,
        "through": through,
        "span": txid_span(txid, through),
        "text": f"{txid_span(txid, through)} will be recomputed, in order: "
        + ", and ".join(parts)
        + ".",
        "states": f"Every state of {view.pipeline} goes back to its value {before}.",
    }


def with_rewind_options(
    rows: list[dict[str, Any]], view: PipelineView, floor: int
) -> list[dict[str, Any]]:
    """``rows`` (:func:`~airflow_txn_provider.ui.model.txid_rows`), each with its ``rewind``:
    :func:`rewind_option`."""
    for row in rows:
        row["rewind"] = rewind_option(view, floor, row["txid"])
    return rows


def rewind_reach(view: PipelineView, floor: int) -> dict[str, Any]:
    """How far a rewind of the pipeline reaches: from ``floor`` (retention and the undo records
    reach no further back) up to the oldest uncommitted txid."""
    newest = view.oldest_uncommitted
    return {
        "floor": floor,
        "newest": newest,
        "text": f"a rewind reaches back to txid {floor}" if floor <= newest else "",
    }


def rewind_rights(may_edit: bool, why_not: str) -> dict[str, Any]:
    """Whether the user may rewind the pipeline (the auth manager's right to edit every DAG that
    runs it, :func:`~airflow_txn_provider.ui.actions.may_edit`) and, if not, why: the page shows
    the action disabled with that reason; the endpoint refuses it anyway."""
    return {"allowed": may_edit, "why_not": None if may_edit else why_not}
