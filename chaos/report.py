"""The result of one chaos run and the table a suite prints: shared by every tier.

A tier (the fast one without Airflow, the Airflow one) turns each run into a :class:`FaultResult`
and calls :func:`print_table`. Nothing here knows what a fault does.

Each run also reports its **re-emissions**: attempts beyond a txid's first, from the log
(:func:`reemissions`). A fault may cost some (its txids replay); a run without a fault
(:data:`NO_FAULT`) must cost none, or it failed: a spurious replay is a bug (issue 46).
"""

from __future__ import annotations

import statistics
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

NO_FAULT = "none"
"""The fault name of a run with no fault injected (a control run): it must re-emit nothing."""


def reemissions(transactions: Iterable[Any]) -> int:
    """Attempts beyond each txid's first, from the log's transactions (each with ``attempt``,
    its current one; attempts are 1, 2, … per txid)."""
    return sum(max(int(t.attempt) - 1, 0) for t in transactions)


@dataclass(frozen=True)
class FaultResult:
    """One run: which fault(s) it suffered, whether the pipeline healed, and what the state holds.

    :param fault: the fault name, or several joined with ``+`` when a run had more than one.
    :param seed: the run's seed: replaying it replays the run's plan (faults, moments, data).
    :param recovered: every txid committed within the run's bound, in order, none left in flight,
        and the committed batches tile the source (no gap, no overlap).
    :param seconds_to_recover: from the fault to the moment every txid that was in flight at the
        fault had committed (the latest of its faults, for a run with several); ``None`` if it
        did not recover.
    :param records_lost: records of the ground truth missing from the state (must be 0).
    :param records_doubled: records counted more than once in the state (must be 0).
    :param detail: what happened, for a person replaying the run.
    :param reemitted: attempts beyond each txid's first (:func:`reemissions`); ``None`` where not
        counted. Must be 0 in a run without a fault (:data:`NO_FAULT`).
    """

    fault: str
    seed: int
    recovered: bool
    seconds_to_recover: float | None
    records_lost: int
    records_doubled: int
    detail: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    reemitted: int | None = None

    @property
    def ok(self) -> bool:
        spurious = self.fault == NO_FAULT and bool(self.reemitted)
        return (
            self.recovered
            and self.records_lost == 0
            and self.records_doubled == 0
            and not (spurious)
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table_rows(results: Iterable[FaultResult]) -> list[list[str]]:
    """One row per fault name (in order of first appearance) and a total row."""
    groups: dict[str, list[FaultResult]] = {}
    for result in results:
        groups.setdefault(result.fault, []).append(result)
    rows = []
    everything = [r for group in groups.values() for r in group]
    for name, group in [*groups.items(), *([("all", everything)] if len(groups) > 1 else [])]:
        times = [r.seconds_to_recover for r in group if r.seconds_to_recover is not None]
        rows.append(
            [
                name,
                str(len(group)),
                f"{sum(r.recovered for r in group)}/{len(group)}",
                _seconds(statistics.median(times) if times else None),
                _seconds(max(times) if times else None),
                str(sum(r.records_lost for r in group)),
                str(sum(r.records_doubled for r in group)),
                _per_run([r.reemitted for r in group]),
            ]
        )
    return rows


def _per_run(counts: Sequence[int | None]) -> str:
    """Re-emissions of a group of runs: their total and the most in one run (``-``: none
    counted)."""
    known = [n for n in counts if n is not None]
    return f"{sum(known)} (max {max(known)})" if known else "-"


HEADER = [
    "fault",
    "runs",
    "recovered",
    "median recovery",
    "max recovery",
    "lost",
    "doubled",
    "re-emitted",
]


def format_table(results: Sequence[FaultResult]) -> str:
    """The table as Markdown (it goes into docs/chaos.md as printed)."""
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    left = {0}

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(cells)
        ]
        return "| " + " | ".join(padded) + " |"

    cells = ["-" * (w + 1) + ("-" if i in left else ":") for i, w in enumerate(widths)]
    rule = "|" + "|".join(cells) + "|"
    return "\n".join([line(HEADER), rule, *(line(r) for r in rows[1:])])


def format_seeds(results: Sequence[FaultResult], width: int = 100) -> str:
    """The seeds of every run, by fault, failed runs marked ``!``: each replays one run."""
    groups: dict[str, list[str]] = {}
    for r in results:
        groups.setdefault(r.fault, []).append(f"{r.seed}{'' if r.ok else '!'}")
    lines = []
    for name, seeds in groups.items():
        lines += textwrap.wrap(
            " ".join(seeds), width=width, initial_indent=f"  {name}: ", subsequent_indent="    "
        )
    return "\n".join(lines)


def print_table(
    results: Sequence[FaultResult], *, title: str | None = None, file: TextIO | None = None
) -> None:
    """Print the table (per fault: runs, recovered, median and max time to recover, records lost,
    records doubled, re-emissions), then every run's seed, then the runs that failed with their
    detail."""
    out = file or sys.stdout
    if title:
        print(title, file=out)
    print(format_table(results), file=out)
    print("seeds (! = failed):", file=out)
    print(format_seeds(results), file=out)
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"FAILED runs ({len(failed)}):", file=out)
        for r in failed:
            print(
                f"  seed {r.seed} [{r.fault}] recovered={r.recovered} lost={r.records_lost} "
                f"doubled={r.records_doubled} re-emitted={r.reemitted}: {r.detail}",
                file=out,
            )
    out.flush()
