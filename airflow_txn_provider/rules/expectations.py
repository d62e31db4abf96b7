"""Data-quality expectations on a txid, pure (issue 60): what a pipeline declares on its input
batch or a staged output, what the layers below measured (one set-based query per output), and the
verdict before the commit, decided exactly so that a bound holds alike on every machine."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.rules.names import COLUMN, check_name

INPUT = "input"  # on= for the input batch; any other value names an output
SAMPLE_KEYS = 5  # failing keys an outcome keeps, each cut to 100 characters
FAILING_ROWS = "({}\n) IS NOT TRUE"  # SQL: NULL fails (unlike a CHECK); \n ends a -- comment
NOT_MEASURED = "not measured by the job"  # an outcome's message: no rows were counted


class Action(StrEnum):
    """What a failed expectation does: ``warn`` (recorded, the txid commits), ``drop`` (failing rows
    are quarantined, the rest commits; row conditions only), ``fail`` (no commit: poison batch)."""

    WARN = "warn"
    DROP = "drop"
    FAIL = "fail"


class Taken(StrEnum):
    """An expectation's outcome for one txid, as the log records it."""

    PASSED = "passed"
    WARNED = "warned"
    DROPPED = "dropped"
    FAILED = "failed"
    NOT_ENOUGH_HISTORY = "not_enough_history"  # a young sigma bound: it passes


_ON_FAILURE = {Action.WARN: Taken.WARNED, Action.DROP: Taken.DROPPED, Action.FAIL: Taken.FAILED}


def _one_line(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: Any, what: str, *, low: float = 0, integer: bool = True) -> Any:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not -math.inf < value < math.inf:
        raise ValueError(f"{what} must be a finite {'int' if integer else 'number'}, got {value!r}")
    if value < low:
        raise ValueError(f"{what} must be >= {low}, got {value!r}")
    return value


def _sql(condition: object, what: str) -> str:
    if not isinstance(condition, str) or not condition.strip() or {";", "\x00"} & set(condition):
        raise ValueError(f"{what} needs one SQL expression (no ';' or NUL), got {condition!r}")
    return condition


@dataclass(frozen=True)
class Measured:
    """One expectation measured on one txid (a :class:`Check` brings its own answer, ``passed``)."""

    expectation: str
    rows_checked: int
    rows_failed: int = 0
    sample_keys: tuple[str, ...] = ()
    passed: bool | None = None
    message: str = ""

    def __post_init__(self) -> None:
        _number(self.rows_failed, f"{self.expectation!r}: rows_failed")
        _number(self.rows_checked, f"{self.expectation!r}: rows_checked", low=self.rows_failed)
        object.__setattr__(self, "sample_keys", tuple(str(k) for k in self.sample_keys))
        if len(self.sample_keys) > self.rows_failed:
            raise ValueError(f"{self.expectation!r}: more sample keys than failing rows")


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """Every expectation's ``on`` (``"input"`` or an output's name), :class:`Action` (or its value)
    and ``name``, unique in the pipeline (``""``: derived from the declaration's text alone)."""

    on: str = INPUT
    action: Action = Action.WARN
    name: str = ""

    def __post_init__(self) -> None:
        kind = type(self).__name__
        check_name(self.on, COLUMN, what=f"{kind} on=")
        if self.action not in tuple(Action):
            raise ValueError(f"{kind} action must be one of {list(map(str, Action))}")
        object.__setattr__(self, "action", Action(self.action))
        if self.action is Action.DROP and not isinstance(self, RowCondition):
            raise ValueError(f"{kind}: drop is for row conditions (a batch names no rows to drop)")
        derived = f"{self.on}: {self._declared()}"  # checks the declaration, named or not
        name = self.name or _one_line(derived, 200)
        if not isinstance(name, str) or not name or name != _one_line(name, 200):
            raise ValueError(f"{kind} name must be one line of 1 to 200 characters: {name!r}")
        object.__setattr__(self, "name", name)

    def _declared(self) -> str:  # refuses a bad declaration, else the text of its derived name
        raise NotImplementedError

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        raise NotImplementedError  # passes (None: not enough history to say), and why


@dataclass(frozen=True)
class RowCondition(Expectation):
    """Every row meets ``condition``, SQL: ``"amount >= 0"`` (:data:`FAILING_ROWS`); may drop."""

    condition: str

    def _declared(self) -> str:
        return _sql(self.condition, "RowCondition")

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        n, failed = measured.rows_checked, measured.rows_failed
        return failed == 0, f"{failed} of {n} rows fail {self.condition}"


@dataclass(frozen=True)
class RowCount(Expectation):
    """The row count is in ``[min, max]`` (either may be left out)."""

    min: int | None = None
    max: int | None = None

    def _declared(self) -> str:
        _number(0 if self.min is None else self.min, "RowCount min")
        if self.max is None:
            return f"rows >= {_number(self.min, 'RowCount min= or max=')}"
        _number(self.max, "RowCount max", low=self.min or 0)
        return f"rows <= {self.max}" if self.min is None else f"rows in [{self.min}, {self.max}]"

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        n = measured.rows_checked
        ok = (self.min is None or n >= self.min) and (self.max is None or n <= self.max)
        return ok, f"{n} rows, expected {self._declared()}"


@dataclass(frozen=True)
class RowCountWithinSigma(Expectation):
    """``|count - mean| <= k * sigma`` over the last ``last`` committed txids' counts (passes below
    ``min_history``), sigma the *sample* standard deviation (n - 1): they are a sample of batches to
    come, whose spread the population's understates. Exact: with sigma = 0 only the mean passes."""

    k: float = 3.0
    last: int = 20
    min_history: int = 5

    def _declared(self) -> str:
        if not _number(self.k, "RowCountWithinSigma k", integer=False, low=-math.inf) > 0:
            raise ValueError(f"RowCountWithinSigma k must be > 0, got {self.k!r}")
        _number(self.min_history, "RowCountWithinSigma min_history", low=2)
        _number(self.last, "RowCountWithinSigma last (at least min_history)", low=self.min_history)
        return f"rows within {self.k} sigma of the last {self.last}"

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        n, counts = measured.rows_checked, list(history)[-self.last :]
        if len(counts) < self.min_history:
            return None, f"{n} rows; {len(counts)} committed txids of {self.min_history} needed"
        c, total, squares = len(counts), sum(counts), sum(x * x for x in counts)
        off = c * n - total  # c (n - mean); c (c - 1) sample variance = c squares - total^2
        ok = off * off * (c - 1) <= Fraction(str(self.k)) ** 2 * (c * squares - total * total) * c
        sd = f"sigma {statistics.stdev(counts):.1f}"
        return ok, f"{n} rows; the last {c} committed txids: mean {total / c:.1f}, {sd}, k {self.k}"


@dataclass(frozen=True)
class FailingShare(Expectation):
    """At most ``max_share`` (in [0, 1)) of the rows fail ``condition``; an empty batch passes."""

    condition: str
    max_share: float = 0.01

    def _declared(self) -> str:
        if not _number(self.max_share, "FailingShare max_share", integer=False) < 1:
            raise ValueError(f"FailingShare max_share must be below 1, got {self.max_share!r}")
        return f"share failing {_sql(self.condition, 'FailingShare')} <= {self.max_share}"

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        n, failed = measured.rows_checked, measured.rows_failed
        ok = failed <= Fraction(str(self.max_share)) * n  # the decimal written: 0.3 is 3/10
        return ok, f"{failed} of {n} rows fail {self.condition}; at most {self.max_share:.2%}"


@dataclass(frozen=True)
class Check(Expectation):
    """``fn(data)`` returns ``(ok, message)``, data the staged rows or an aggregate (a lambda needs
    a ``name``)."""

    fn: Callable[[Any], tuple[bool, str]]

    def _declared(self) -> str:
        name = str(getattr(self.fn, "__qualname__", getattr(self.fn, "__name__", "")))
        if not callable(self.fn) or not (self.name or (name and not name.endswith("<lambda>"))):
            raise ValueError(f"Check needs a callable, and name= for a lambda: got {self.fn!r}")
        return name

    def judge(self, measured: Measured, history: Sequence[int]) -> tuple[bool | None, str]:
        return measured.passed, measured.message or f"{self.name} answered {measured.passed}"

    def measure(self, rows: Sequence[Any]) -> Measured:
        """``fn(rows)``'s answer; a check that raises has failed, its error the message."""
        try:
            ok, message = self.fn(rows)
        except Exception as err:  # the check's own bug: a failed check, saying why
            return Measured(self.name, len(rows), 0, passed=False, message=f"raised {err!r}")
        return Measured(self.name, len(rows), 0, passed=bool(ok), message=str(message))


def check_declared(expectations: Iterable[Expectation]) -> tuple[Expectation, ...]:
    """A pipeline's expectations, checked as a set: each an :class:`Expectation`, names unique."""
    found = tuple(expectations)
    if not all(isinstance(e, Expectation) for e in found):
        raise ValueError(f"expectations are RowCondition, RowCount, ..., Check: got {found!r}")
    names = [e.name for e in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"expectation names must differ (give name=): {twice}")
    return found


@dataclass(frozen=True)
class Outcome:
    """One expectation's outcome for one txid: what the log records and the page shows."""

    expectation: str
    on: str
    action: Action
    taken: Taken
    rows_checked: int
    rows_failed: int
    sample_keys: tuple[str, ...]
    message: str


def outcome_record(outcome: Outcome) -> dict[str, Any]:
    """``outcome`` as the log stores it, one JSON object per expectation in the attempt's row."""
    return {
        "expectation": outcome.expectation,
        "on": outcome.on,
        "action": str(outcome.action),
        "taken": str(outcome.taken),
        "rows_checked": outcome.rows_checked,
        "rows_failed": outcome.rows_failed,
        "sample_keys": list(outcome.sample_keys),
        "message": outcome.message,
    }


def failed_a_fail_expectation(records: Iterable[Mapping[str, Any]] | None) -> bool:
    """Whether an attempt's recorded outcomes (:func:`outcome_record`) include a failed ``fail``
    expectation: the attempt is a poison batch."""
    return any(r.get("taken") == Taken.FAILED for r in records or ())


@dataclass(frozen=True)
class Verdict:
    """The expectations' answer for one txid: commit or stop, and what goes to quarantine."""

    outcomes: tuple[Outcome, ...]

    @property
    def commits(self) -> bool:
        """False: a ``fail`` expectation failed, the txid is a poison batch."""
        return all(o.taken is not Taken.FAILED for o in self.outcomes)

    @property
    def quarantine(self) -> dict[str, tuple[str, ...]]:
        """``on`` -> drop expectations: a row failing any is quarantined, if the txid commits."""
        out: dict[str, tuple[str, ...]] = {}
        for o in (o for o in self.outcomes if o.taken is Taken.DROPPED and self.commits):
            out[o.on] = (*out.get(o.on, ()), o.expectation)
        return out


def judge_expectations(
    declared: Iterable[Expectation],
    measured: Iterable[Measured],
    history_counts: Mapping[str, Sequence[int]] | None = None,
) -> Verdict:
    """One txid's verdict from each expectation's measurement and a sigma bound's ``history_counts``
    (by name: its counts in committed txids, oldest first). A measurement missing, doubled or not
    declared, or a sigma bound's history missing, is a ``ValueError``: no measure, no pass."""
    expectations, measurements = check_declared(declared), tuple(measured)
    by_name = {m.expectation: m for m in measurements}
    names, history = [e.name for e in expectations], history_counts or {}
    if len(by_name) != len(measurements) or set(by_name) != set(names):
        got = sorted(m.expectation for m in measurements)
        raise ValueError(f"expectations declared {sorted(names)}, measured {got}")
    outcomes = []
    for exp in expectations:
        m, past = by_name[exp.name], []
        if isinstance(exp, Check) and m.passed is None:
            raise ValueError(f"check {exp.name!r} measured without its answer (passed=)")
        if isinstance(exp, RowCountWithinSigma):
            if exp.name not in history:
                raise ValueError(f"sigma bound {exp.name!r}: no history given (empty if none)")
            past = [_number(c, f"{exp.name!r} history") for c in history[exp.name]]
        ok, why = exp.judge(m, past)
        taken = Taken.NOT_ENOUGH_HISTORY if ok is None else _ON_FAILURE[exp.action]
        taken = Taken.PASSED if ok else taken  # None: a sigma bound too young to judge passes
        keys = tuple(_one_line(k, 100) for k in m.sample_keys[:SAMPLE_KEYS])
        row = (m.rows_checked, m.rows_failed, keys, f"{_one_line(why, 380)}: {taken}")
        outcomes.append(Outcome(exp.name, exp.on, exp.action, taken, *row))
    return Verdict(tuple(outcomes))


def poison_note(pipeline: str, txid: int, attempt: int, verdict: Verdict) -> str:
    """What a pipeline stopped by ``fail`` expectations says: each, its counts and sample keys."""
    if verdict.commits:
        raise ValueError(f"txid {txid} commits: no expectation stopped it")
    failed = []
    for o in (o for o in verdict.outcomes if o.taken is Taken.FAILED):
        keys = f" (sample keys: {', '.join(o.sample_keys)})" if o.sample_keys else ""
        failed.append(f"{o.expectation!r} on {o.on}: {o.message}{keys}")
    return (
        f"pipeline={pipeline} txid={txid} attempt={attempt}: poison batch, stopped before its "
        f"commit by {len(failed)} failed expectation(s): {'; '.join(failed)}. Fix the data or "
        "the rule, then Clear this txid's run in the Airflow UI: it reruns, then every later txid."
    )


_SPEC_KINDS: dict[str, type[Expectation]] = {
    k.__name__: k for k in (RowCondition, FailingShare, RowCount, RowCountWithinSigma)
}
_SPEC_FIELDS = {
    "RowCondition": ("condition",),
    "FailingShare": ("condition", "max_share"),
    "RowCount": ("min", "max"),
    "RowCountWithinSigma": ("k", "last", "min_history"),
}


def expectation_spec(expectation: Expectation) -> dict[str, Any]:
    """``expectation`` as JSON-compatible data, for a job that measures it elsewhere (a
    ``spark-submit``ted job's arguments); a :class:`Check` (Python code) has none."""
    kind = type(expectation).__name__
    if kind not in _SPEC_KINDS or type(expectation) is not _SPEC_KINDS[kind]:
        raise ValueError(f"{expectation.name!r}: a {kind} cannot travel as JSON (SQL ones only)")
    spec = {"kind": kind, "on": expectation.on, "action": str(expectation.action)}
    spec |= {"name": expectation.name, **{f: getattr(expectation, f) for f in _SPEC_FIELDS[kind]}}
    return spec


def expectation_from_spec(spec: Mapping[str, Any]) -> Expectation:
    """The expectation :func:`expectation_spec` described, checked as a declaration is."""
    if not isinstance(spec, Mapping) or spec.get("kind") not in _SPEC_KINDS:
        raise ValueError(f"not an expectation's spec (kind: {sorted(_SPEC_KINDS)}): {spec!r}")
    kind = str(spec["kind"])
    allowed = {"kind", "on", "action", "name", *_SPEC_FIELDS[kind]}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"{kind} spec: unknown field(s) {unknown}")
    return _SPEC_KINDS[kind](**{k: v for k, v in spec.items() if k != "kind"})
