"""Expectations measured in the Spark job (issue 60): on the input batch (``on="input"``) and on
the rows the job writes for a lake sink (``on=<sink>``), where those rows are.

Per measured DataFrame ONE aggregation (its row count and, per distinct condition, the rows
failing it: :data:`~airflow_txn_provider.rules.expectations.FAILING_ROWS`, a NULL answer fails),
then, only for a condition some rows fail, the first few failing rows' sample keys (a top-k by
their text, so that a duplicate run of the attempt records the same). The job records them with
its output, ``audit:<on>`` (:data:`~airflow_txn_provider.rules.vocabulary.AUDIT_OUTPUT_PREFIX`),
one dict per expectation (:func:`measured_record`); the commit judges them with the states'
(:mod:`airflow_txn_provider.transactions.audit`). A condition Spark cannot analyse (a column that
does not exist, not a boolean) is recorded as such (``error``): the commit stops the txid naming
it, whatever its action, as for a state's.

A ``drop`` expectation's failing rows are taken out here (:class:`JobAudit`): the transform is
given the input records that meet the input's, a lake sink's staged files hold only its rows
that meet its; the rows taken out are staged with the job's output for the commit to quarantine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from functools import reduce
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.compat.spark import to_arrow
from airflow_txn_provider.rules.expectations import (
    FAILING_ROWS,
    INPUT,
    SAMPLE_KEYS,
    Action,
    Check,
    Expectation,
    FailingShare,
    Measured,
    RowCondition,
    expectation_from_spec,
    expectation_spec,
)
from airflow_txn_provider.rules.vocabulary import audit_output_key

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.sources.base import SparkSource

INPUT_KEY_COLUMNS = ("partition", "p", "offset")
"""The input's columns a failing record is named by, when it has them (a source's own
``partition_column`` and ``offset_column`` first); else its first columns."""
FIRST_COLUMNS = 3


def for_job(
    expectations: Iterable[Expectation], sinks: Iterable[LakeSink]
) -> tuple[Expectation, ...]:
    """The expectations a job measures: the SQL ones on the input batch or on one of its lake
    sinks (a :class:`Check` on a sink is given its staged rows by the commit)."""
    measured_on = {INPUT, *(s.name for s in sinks)}
    return tuple(e for e in expectations if e.on in measured_on and not isinstance(e, Check))


def to_arg(expectations: Sequence[Expectation]) -> list[str]:
    """The job's ``--expectations`` argument (none when it measures nothing)."""
    specs = [expectation_spec(e) for e in expectations]
    return ["--expectations", json.dumps(specs, sort_keys=True)] if specs else []


def from_arg(text: str) -> tuple[Expectation, ...]:
    """The expectations of a ``--expectations`` argument (``ValueError`` if it is not one)."""
    specs = json.loads(text)
    if not isinstance(specs, list):
        raise ValueError(f"--expectations is a JSON list of expectations, got {text[:100]!r}")
    return tuple(expectation_from_spec(s) for s in specs)


def conditions_of(expectations: Iterable[Expectation]) -> list[str]:
    """The distinct SQL conditions the expectations count failing rows of, in declared order."""
    found = [e.condition for e in expectations if isinstance(e, RowCondition | FailingShare)]
    return list(dict.fromkeys(found))


def sample_columns(columns: Sequence[str], preferred: Iterable[str | None]) -> list[str]:
    """The columns a failing row is named by: the ``preferred`` the frame has, else its first."""
    found = [c for c in dict.fromkeys(p for p in preferred if p) if c in columns]
    return found or list(columns[:FIRST_COLUMNS])


def render_key(row_json: str, columns: Sequence[str]) -> str:
    """A failing row's sample key as text, ``col=value, …`` (a NULL shown as ``NULL``), from its
    columns as Spark's ``to_json`` wrote them (it leaves NULL fields out)."""
    values = json.loads(row_json)
    return ", ".join(f"{c}={_text(values.get(c))}" for c in columns)


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def measured_record(
    expectation: Expectation,
    rows: int,
    failing: Mapping[str, int],
    samples: Mapping[str, Sequence[str]],
    errors: Mapping[str, str],
) -> dict[str, Any]:
    """One expectation's measurement as the job records it: a :class:`Measured` as a dict, or
    ``{"expectation", "error"}`` for a condition Spark could not analyse."""
    condition = getattr(expectation, "condition", None)
    if condition is not None and condition in errors:
        return {"expectation": expectation.name, "error": errors[condition]}
    failed = failing.get(condition, 0) if condition is not None else 0
    keys = tuple(samples.get(condition, ())[:SAMPLE_KEYS]) if condition is not None else ()
    measured = Measured(expectation.name, rows, failed, keys[:failed])
    return {**asdict(measured), "sample_keys": list(measured.sample_keys)}


def measure_frame(
    frame: DataFrame,
    expectations: Sequence[Expectation],
    key_columns: Sequence[str],
    check: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Measure ``expectations`` over ``frame``: one aggregation, then the failing rows' sample
    keys (``key_columns``) where some fail. ``check()`` before each Spark action."""
    from pyspark.sql import functions as F

    conditions = conditions_of(expectations)
    failing = {c: F.expr(FAILING_ROWS.format(c)) for c in conditions}
    errors: dict[str, str] = {}

    def aggregate() -> Any:
        check()
        counts = [F.count_if(failing[c]).alias(f"f{i}") for i, c in enumerate(conditions)]
        return frame.agg(F.count(F.lit(1)).alias("n"), *counts).first()

    try:
        found = aggregate()
    except Exception:  # a condition Spark cannot analyse is the audit's to report, not the job's
        errors = _unanalysable(frame, failing)
        if not errors:
            raise  # the transform's, or a runtime error of a condition: the attempt fails
        conditions = [c for c in conditions if c not in errors]
        found = aggregate()
    rows = int(found["n"])
    failed = {c: int(found[f"f{i}"]) for i, c in enumerate(conditions)}
    samples: dict[str, list[str]] = {}
    key = F.to_json(F.struct(*[F.col(c) for c in key_columns])).alias("k")
    for condition in (c for c in conditions if failed[c]):
        check()
        first = frame.where(failing[condition]).select(key).orderBy("k").limit(SAMPLE_KEYS)
        samples[condition] = [render_key(r["k"], key_columns) for r in first.collect()]
    return [measured_record(e, rows, failed, samples, errors) for e in expectations]


def _unanalysable(frame: DataFrame, failing: Mapping[str, Any]) -> dict[str, str]:
    """The conditions Spark refuses to analyse over ``frame``, each with the first line why."""
    errors = {}
    for condition, column in failing.items():
        try:
            frame.select(column).schema  # noqa: B018 - analyses it, runs nothing
        except Exception as err:
            errors[condition] = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return errors


DROPPED_EXPECTATIONS, DROPPED_ROW = "expectations", "row"
"""The columns of a frame's dropped rows (:meth:`JobAudit.dropped_rows`): the names of the drop
expectations each fails, and the row itself as JSON (NULL fields kept, as a state's are)."""


def split_drops(frame: DataFrame, drops: Sequence[RowCondition]) -> tuple[DataFrame, DataFrame]:
    """``frame`` split by ``drops``: the rows meeting every one (what commits), and the others
    as (:data:`DROPPED_EXPECTATIONS`, :data:`DROPPED_ROW`) for the quarantine. The same
    :data:`~airflow_txn_provider.rules.expectations.FAILING_ROWS` as the counts: the two add up."""
    from pyspark.sql import functions as F

    failing = [(d.name, F.expr(FAILING_ROWS.format(d.condition))) for d in drops]
    any_fails = reduce(lambda a, b: a | b, (f for _, f in failing))
    names = F.array(*[F.when(f, F.lit(name)) for name, f in failing])
    row = F.to_json(F.struct(*[frame[c] for c in frame.columns]), {"ignoreNullFields": "false"})
    dropped = frame.where(any_fails).select(
        F.filter(names, lambda n: n.isNotNull()).alias(DROPPED_EXPECTATIONS),
        row.alias(DROPPED_ROW),
    )
    return frame.where(~any_fails), dropped


class JobAudit:
    """A job's audit: it measures the input batch and each lake sink's rows as the job makes
    them (:func:`measure_frame`) and takes out the rows failing ``drop`` expectations
    (:func:`split_drops`), so that what the job transforms or writes is what commits.
    ``check()`` before each Spark action."""

    def __init__(
        self, expectations: Sequence[Expectation], check: Callable[[], None] = lambda: None
    ) -> None:
        self.expectations, self.check = tuple(expectations), check
        self.measured: dict[str, list[dict[str, Any]]] = {}
        self._dropped: dict[str, DataFrame] = {}

    def _audit(
        self, on: str, measured: DataFrame, kept: DataFrame, keys: Sequence[str]
    ) -> DataFrame:
        mine = [e for e in self.expectations if e.on == on]
        if not mine:
            return kept
        records = measure_frame(measured, mine, keys, self.check)
        self.measured[audit_output_key(on)] = records
        drops = _drops(mine, on)
        if not drops or any("error" in r for r in records):  # unanalysable: the commit stops
            return kept
        # the rows taken out are collected from what was measured, not from the input's
        # ``kept``: that carries the batch's observation, the transform's pass to complete
        self._dropped[on] = split_drops(measured, drops)[1]
        return split_drops(kept, drops)[0]

    def input(self, source: SparkSource, batch: DataFrame, records: DataFrame) -> DataFrame:
        """The input ``records`` the transform is given: those meeting the input's drops (the
        expectations measured over ``batch``, the same records read apart)."""
        own = (getattr(source, "partition_column", None), getattr(source, "offset_column", None))
        keys = sample_columns(batch.columns, [*own, *INPUT_KEY_COLUMNS])
        return self._audit(INPUT, batch, records, keys)

    def sink(self, sink: LakeSink, frame: DataFrame) -> DataFrame:
        """The rows written for ``sink``: ``frame``'s that meet its drops."""
        return self._audit(sink.name, frame, frame, sample_columns(frame.columns, sink.keys))

    def dropped_rows(self) -> dict[str, pa.Table]:
        """Per ``on``, the rows taken out, collected (the job stages them with its output)."""
        found = {}
        for on, frame in self._dropped.items():
            self.check()
            found[on] = to_arrow(frame)
        return found


def input_kept(expectations: Sequence[Expectation], records: DataFrame) -> DataFrame:
    """The input ``records`` meeting the input's drops, unmeasured: a fill's transform is given
    what the txid's live one was (its rows were quarantined by its live commit)."""
    drops = _drops(expectations, INPUT)
    return split_drops(records, drops)[0] if drops else records


def _drops(expectations: Iterable[Expectation], on: str) -> list[RowCondition]:
    return [
        e
        for e in expectations
        if e.on == on and isinstance(e, RowCondition) and e.action is Action.DROP
    ]


__all__ = [
    "DROPPED_EXPECTATIONS",
    "DROPPED_ROW",
    "JobAudit",
    "for_job",
    "from_arg",
    "input_kept",
    "measure_frame",
    "measured_record",
    "render_key",
    "sample_columns",
    "split_drops",
    "to_arg",
]
