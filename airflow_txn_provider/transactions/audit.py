"""The audit before a txid's commit (issue 60), inside the commit's transaction and lock.

Per state the expectations declared on it are measured over the staged rows
(:func:`airflow_txn_provider.state.audit.measure`, one query), judged by the pure rules
(:func:`~airflow_txn_provider.rules.expectations.judge_expectations`, a sigma bound against the
counts the last committed txids recorded), and then either the txid stops
(:class:`~airflow_txn_provider.rules.exceptions.ExpectationsFailedError`: the commit rolls back,
the log records the outcomes with the failure, the pipeline stops at a poison batch) or the rows
failing ``drop`` expectations move to the quarantine and the txid commits what is left.
States a commit derives are audited after they are derived, so :func:`audit_states` runs twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.log.expectations import committed_counts
from airflow_txn_provider.rules.exceptions import (
    ExpectationsFailedError,
    StagedOutputMismatchError,
)
from airflow_txn_provider.rules.expectations import (
    Expectation,
    Outcome,
    RowCondition,
    RowCountWithinSigma,
    Taken,
    Verdict,
    judge_expectations,
    outcome_record,
    poison_note,
)
from airflow_txn_provider.state.audit import Uncheckable, measure, quarantine
from airflow_txn_provider.utils import metrics

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.state import MapState


@dataclass
class Audit:
    """What the audits of one commit found: every outcome, and per state the rows dropped."""

    outcomes: list[Outcome] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)

    def records(self) -> list[dict[str, Any]]:
        return [outcome_record(o) for o in self.outcomes]


def audit_states(
    conn: Connection,
    states: Sequence[MapState],
    expectations: Sequence[Expectation],
    txid: int,
    attempt: int,
    *,
    rows: Mapping[str, int | None],
    audit: Audit,
    staged_attempt: int | None = None,
) -> None:
    """Audit ``(txid, attempt)``'s staged rows in ``states`` (rows of ``staged_attempt``, by
    default ``attempt``) against the ``expectations`` declared on them, adding to ``audit``.
    ``rows``: per state, the staged rows the attempt recorded (a count unlike it is staging lost
    to a Postgres crash: the txid replays, it is not judged on what is left)."""
    if not states:
        return
    pipeline, staged = states[0].pipeline, attempt if staged_attempt is None else staged_attempt
    on = {s.name: [e for e in expectations if e.on == s.name] for s in states}
    measured = []
    for state in (s for s in states if on[s.name]):
        try:
            n, found = measure(conn, state, txid, staged, on[state.name])
        except Uncheckable as err:
            _refuse_uncheckable(pipeline, txid, attempt, on[state.name], err, audit)
        expected = rows.get(state.name)
        if expected is not None and n != expected:
            raise StagedOutputMismatchError(
                f"state {state.name!r}: {n} staged rows found before the audit, the attempt "
                f"recorded {expected} (staging lost, e.g. after a Postgres crash); replay the txid",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
            )
        measured += found
    declared = [e for s in states for e in on[s.name]]
    if not declared:
        return
    sigma = [e for e in declared if isinstance(e, RowCountWithinSigma)]
    history = (
        committed_counts(
            conn, pipeline, [e.name for e in sigma], max(e.last for e in sigma), before_txid=txid
        )
        if sigma
        else {}
    )
    verdict = judge_expectations(declared, measured, history)
    audit.outcomes += verdict.outcomes
    if not verdict.commits:
        _stop(pipeline, txid, attempt, Verdict(tuple(audit.outcomes)), audit)
    by_name = {e.name: e for e in declared}
    for state in states:
        drops = [by_name[n] for n in verdict.quarantine.get(state.name, ())]
        conditions = [d for d in drops if isinstance(d, RowCondition)]
        moved = quarantine(conn, state, txid, attempt, conditions, staged_attempt=staged)
        if moved:
            audit.dropped[state.name] = audit.dropped.get(state.name, 0) + moved


def _stop(pipeline: str, txid: int, attempt: int, verdict: Verdict, audit: Audit) -> None:
    audit.dropped.clear()  # the commit rolls back: nothing is quarantined
    send_metrics(pipeline, audit)  # and its outcomes are told now, or never
    raise ExpectationsFailedError(
        poison_note(pipeline, txid, attempt, verdict),
        outcomes=audit.records(),
        pipeline=pipeline,
        txid=txid,
        attempt=attempt,
    )


def _refuse_uncheckable(
    pipeline: str,
    txid: int,
    attempt: int,
    expectations: Sequence[Expectation],
    err: Uncheckable,
    audit: Audit,
) -> None:
    """An expectation Postgres cannot evaluate stops the txid whatever its action: a rule that
    cannot be checked says nothing, and warning past it would publish unaudited rows."""
    exp = next(e for e in expectations if e.name == err.expectation)
    message = f"cannot be checked: {err}"
    audit.outcomes.append(Outcome(exp.name, exp.on, exp.action, Taken.FAILED, 0, 0, (), message))
    _stop(pipeline, txid, attempt, Verdict(tuple(audit.outcomes)), audit)


def send_metrics(pipeline: str, audit: Audit) -> None:
    """Per expectation judged (its txid committed, or stopped): rows checked and failed, and
    what was done unless it passed; the rows quarantined."""
    for o in audit.outcomes:
        name = o.expectation
        metrics.incr(metrics.EXPECTATION_ROWS_CHECKED, pipeline, o.rows_checked, expectation=name)
        metrics.incr(metrics.EXPECTATION_ROWS_FAILED, pipeline, o.rows_failed, expectation=name)
        if o.taken is not Taken.PASSED:
            metrics.incr(metrics.EXPECTATION_OUTCOMES, pipeline, expectation=name, taken=o.taken)
    metrics.incr(metrics.QUARANTINED_ROWS, pipeline, sum(audit.dropped.values()))


__all__ = ["Audit", "audit_states", "send_metrics"]
