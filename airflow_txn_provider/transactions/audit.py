"""The audit before a txid's commit (issue 60), inside the commit's transaction and lock.

Per state the expectations declared on it are measured over the staged rows
(:func:`airflow_txn_provider.state.audit.measure`, one query), judged by the pure rules
(:func:`~airflow_txn_provider.rules.expectations.judge_expectations`, a sigma bound against the
counts the last committed txids recorded), and then either the txid stops
(:class:`~airflow_txn_provider.rules.exceptions.ExpectationsFailedError`: the commit rolls back,
the log records the outcomes with the failure, the pipeline stops at a poison batch) or the rows
failing ``drop`` expectations move to the quarantine and the txid commits what is left.
States a commit derives are audited after they are derived, so :func:`audit_states` runs twice.

Expectations on the input batch and on the lake sinks are measured by the Spark job
(:mod:`airflow_txn_provider.spark.audit`), which records them with its output (``audit:<on>``)
and stages the rows its drops took out; :func:`audit_measured` judges them first, by the same
rules, and moves those rows to the quarantine. One a job did not measure (a job of
an older version) is ``failed`` if its action is ``fail`` (the txid stops: nothing unaudited is
published past a ``fail``), else ``warned``, both with the message "not measured by the job"; one
whose condition Spark could not analyse is ``failed`` whatever its action, as for a state's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.log.expectations import committed_counts, publish_quarantined
from airflow_txn_provider.rules.exceptions import (
    ExpectationsFailedError,
    StagedOutputMismatchError,
)
from airflow_txn_provider.rules.expectations import (
    INPUT,
    NOT_MEASURED,
    Action,
    Check,
    Expectation,
    Measured,
    Outcome,
    RowCondition,
    RowCountWithinSigma,
    Taken,
    Verdict,
    judge_expectations,
    outcome_record,
    poison_note,
)
from airflow_txn_provider.rules.vocabulary import audit_output_key, lake_output_key
from airflow_txn_provider.sinks.base import StagedFiles
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
    verdict = judge_expectations(declared, measured, _history(conn, pipeline, declared, txid))
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


def _history(
    conn: Connection, pipeline: str, declared: Sequence[Expectation], txid: int
) -> dict[str, list[int]]:
    """The sigma bounds' histories: their counts in the last committed txids before ``txid``."""
    sigma = [e for e in declared if isinstance(e, RowCountWithinSigma)]
    if not sigma:
        return {}
    last = max(e.last for e in sigma)
    return committed_counts(conn, pipeline, [e.name for e in sigma], last, before_txid=txid)


def audit_measured(
    conn: Connection,
    pipeline: str,
    sinks: Iterable[str],
    expectations: Sequence[Expectation],
    output: Mapping[str, Any],
    txid: int,
    attempt: int,
    *,
    audit: Audit,
) -> None:
    """Judge the ``expectations`` on the input batch and on the lake ``sinks`` (names) from what
    the job measured and recorded in ``(txid, attempt)``'s ``output``, adding to ``audit``; a
    failed ``fail`` one stops the txid (:class:`ExpectationsFailedError`)."""
    on = {INPUT, *sinks}
    declared = [e for e in expectations if e.on in on]
    if not declared:
        return
    judged: list[Expectation] = []
    measured: list[Measured] = []
    direct: dict[str, Outcome] = {}
    for exp in declared:
        if isinstance(exp, Check):  # Python: given the sink's staged rows here
            files = output.get(lake_output_key(exp.on))
            rows = StagedFiles.from_json(files).read().to_pylist() if files else []
            judged.append(exp)
            measured.append(exp.measure(rows))
            continue
        records = output.get(audit_output_key(exp.on)) or ()
        found = next((r for r in records if r.get("expectation") == exp.name), None)
        if found is None or "error" in found:
            taken = Taken.FAILED if found or exp.action is Action.FAIL else Taken.WARNED
            why = f"cannot be checked: {found['error']}" if found else NOT_MEASURED
            direct[exp.name] = Outcome(exp.name, exp.on, exp.action, taken, 0, 0, (), why)
            continue
        judged.append(exp)
        keys = tuple(found.get("sample_keys") or ())
        rows = (int(found["rows_checked"]), int(found.get("rows_failed") or 0), keys)
        measured.append(Measured(exp.name, *rows))
    verdict = judge_expectations(judged, measured, _history(conn, pipeline, judged, txid))
    by_name = {**direct, **{o.expectation: o for o in verdict.outcomes}}
    audit.outcomes += [by_name[e.name] for e in declared]
    if any(o.taken is Taken.FAILED for o in by_name.values()):
        _stop(pipeline, txid, attempt, Verdict(tuple(audit.outcomes)), audit)
    if any(e.action is Action.DROP for e in expectations):  # a job may have staged drops
        dropped = {o.on for o in by_name.values() if o.taken is Taken.DROPPED}
        audited_on = {e.on for e in declared}
        moved = publish_quarantined(conn, pipeline, txid, attempt, audited_on, dropped)
        for output_name, n in moved.items():
            audit.dropped[output_name] = audit.dropped.get(output_name, 0) + n


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


__all__ = ["Audit", "audit_measured", "audit_states", "send_metrics"]
