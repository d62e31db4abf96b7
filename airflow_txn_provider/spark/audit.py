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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.rules.expectations import (
    FAILING_ROWS,
    INPUT,
    SAMPLE_KEYS,
    Expectation,
    FailingShare,
    Measured,
    RowCondition,
    expectation_from_spec,
    expectation_spec,
)
from airflow_txn_provider.rules.vocabulary import audit_output_key

if TYPE_CHECKING:
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
    """The expectations a job measures: those on the input batch or on one of its lake sinks."""
    measured_on = {INPUT, *(s.name for s in sinks)}
    return tuple(e for e in expectations if e.on in measured_on)


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


def measure_job(
    expectations: Sequence[Expectation],
    source: SparkSource,
    records: DataFrame,
    by_sink: Mapping[LakeSink, DataFrame],
    check: Callable[[], None] = lambda: None,
) -> dict[str, list[dict[str, Any]]]:
    """The job's measurements, ``{audit_output_key(on): [record, …]}``: of the input batch as the
    transform reads it (``records``) and of each lake sink's DataFrame."""
    found: dict[str, list[dict[str, Any]]] = {}
    on_input = [e for e in expectations if e.on == INPUT]
    if on_input:
        own = (getattr(source, "partition_column", None), getattr(source, "offset_column", None))
        keys = sample_columns(records.columns, [*own, *INPUT_KEY_COLUMNS])
        found[audit_output_key(INPUT)] = measure_frame(records, on_input, keys, check)
    for sink, frame in by_sink.items():
        on_sink = [e for e in expectations if e.on == sink.name]
        if on_sink:
            keys = sample_columns(frame.columns, sink.keys)
            found[audit_output_key(sink.name)] = measure_frame(frame, on_sink, keys, check)
    return found


__all__ = [
    "for_job",
    "from_arg",
    "measure_frame",
    "measure_job",
    "measured_record",
    "render_key",
    "sample_columns",
    "to_arg",
]
