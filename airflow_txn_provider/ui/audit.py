"""What the Transactions page shows of each txid's audit (issue 60): the column's summary, the
panel, the trend per expectation. Pure shaping of what the reader loads; it imports neither
:mod:`~airflow_txn_provider.ui.model` nor :mod:`~airflow_txn_provider.ui.reader`, which import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

TAKEN_ORDER = ("failed", "warned", "dropped", "not_enough_history", "passed")
"""Outcomes (``rules.expectations.Taken``) as a txid's audit names them, the worst first."""
QUARANTINE_SAMPLE = 20
"""Quarantined rows a txid's panel lists (its count says how many there are)."""
SPARK_BOX = (160, 28)
"""Width and height of an expectation's sparkline, in SVG user units (the page draws it so)."""
Audited = Iterable[tuple[int, int, Sequence[Mapping[str, Any]]]]
"""``(txid, attempt, outcomes)`` of the attempts that recorded any (``attempt_outcomes`` reads
them, in ``log/expectations.py``)."""


def audit_summary(outcomes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """An attempt's outcomes in a few words, the worst first (``failed: <name>``, ``1 warned · 1
    dropped (12 rows) · 3 passed``; ``""`` when it recorded none), its worst outcome (``level``)
    and one line per expectation (``title``)."""
    by: dict[str, list[Mapping[str, Any]]] = {taken: [] for taken in TAKEN_ORDER}
    for o in outcomes:
        by.setdefault(str(o.get("taken")), []).append(o)
    failed = ", ".join(str(o.get("expectation")) for o in by["failed"])
    parts, lines = [f"failed: {failed}"] if failed else [], []
    for taken, found in by.items():
        rows = f" ({sum(int(o.get('rows_failed') or 0) for o in found)} rows)"
        if found and taken != "failed":
            parts.append(
                f"{len(found)} {taken.replace('_', ' ')}{rows if taken == 'dropped' else ''}"
            )
        lines += [
            f"{o.get('expectation')} on {o.get('on')} ({o.get('action')}): {taken}, "
            f"{o.get('rows_failed')} of {o.get('rows_checked')} rows failed"
            for o in found
        ]
    level = next((taken for taken, found in by.items() if found), "")
    return {"text": " · ".join(parts), "level": level, "title": "\n".join(lines)}


def with_audit(rows: list[dict[str, Any]], audited: Audited) -> list[dict[str, Any]]:
    """``rows`` (:func:`~airflow_txn_provider.ui.model.txid_rows`), each with its current
    attempt's ``audit`` (:func:`audit_summary`; its ``text`` empty when that attempt recorded no
    outcome)."""
    outcomes = {(txid, attempt): found for txid, attempt, found in audited}
    for row in rows:
        row["audit"] = audit_summary(outcomes.get((row["txid"], row["attempt"]), ()))
    return rows


def expectation_trends(
    committed: Iterable[tuple[int, Sequence[Mapping[str, Any]]]], audited: Audited
) -> list[dict[str, Any]]:
    """Per expectation seen in ``committed`` (the listed committed txids' outcomes, oldest first:
    what ``log.expectations.committed_outcomes`` reads) or failed by an attempt of ``audited``
    (the listed txids'): its rows failed per committed txid (``points``, ``[txid, rows]``, drawn
    as ``spark``), how many of those txids it ``warned``, ``dropped``, ``passed`` (or could not
    judge yet), and in how many listed txids it ``failed`` an attempt (a poison batch)."""
    trends: dict[str, dict[str, Any]] = {}

    def trend(o: Mapping[str, Any]) -> dict[str, Any]:
        found = trends.setdefault(
            str(o["expectation"]), {"points": [], "n": Counter(), "by": set()}
        )
        found.update(expectation=o["expectation"], on=o["on"], action=o["action"])  # newest
        return found

    for txid, outcomes in committed:
        for o in outcomes:
            trend(o)["points"].append([txid, int(o["rows_failed"])])
            trend(o)["n"][o["taken"]] += 1
    for txid, _, outcomes in audited:
        for o in (o for o in outcomes if o.get("taken") == "failed"):
            trend(o)["by"].add(txid)
    return [
        {
            **{key: t[key] for key in ("expectation", "on", "action", "points")},
            **{taken: t["n"][taken] for taken in TAKEN_ORDER[1:]},
            "failed": len(t["by"]),
            "txids": len(t["points"]),
            "first_txid": t["points"][0][0] if t["points"] else None,
            "last_txid": t["points"][-1][0] if t["points"] else None,
            "max_failed": max((n for _, n in t["points"]), default=0),
            "spark": sparkline(t["points"]),
        }
        for t in trends.values()
    ]


def sparkline(points: Sequence[Sequence[float]], box: tuple[int, int] = SPARK_BOX) -> str:
    """An SVG polyline's ``points`` for ``[txid, value]`` pairs (txids ascending) in ``box``: the
    first txid at the left, the last at the right, 0 at the bottom, the largest value at the top
    (a single txid: a level line). ``""`` for no pairs."""
    if not points:
        return ""
    if len(points) == 1:
        points = [[points[0][0] - 1, points[0][1]], points[0]]
    (w, h), pad = box, 1.0
    x0, top = points[0][0], max(1, *(v for _, v in points))
    span = max(1, points[-1][0] - x0)
    return " ".join(
        f"{pad + (t - x0) / span * (w - 2 * pad):.1f},{h - pad - v / top * (h - 2 * pad):.1f}"
        for t, v in points
    )
