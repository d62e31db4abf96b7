"""A pipeline's outputs, its states and lake sinks: the rules, pure.

From which txid each is complete (:func:`completeness`), how one joins a pipeline that has begun
txids, and how one leaves; their rows are :mod:`airflow_txn_provider.log.outputs`'s. An output
declared before any txid began is complete from txid 1. One added later must say how it starts
(:class:`~airflow_txn_provider.rules.vocabulary.OutputStart`), else
:class:`OutputStartRequiredError`: ``"next_txid"`` holds exactly the txids from the next to begin,
``N`` (each began after the declaration, which holds the pipeline's lock; a txid below ``N`` that
commits later is not applied to it: :func:`skipped_at_commit`); ``"history"`` is filled below
``N`` by a fill (:mod:`airflow_txn_provider.rules.filling`). An output no longer declared that
holds committed txids needs ``retired={name: "keep" | "drop"}``
(:class:`~airflow_txn_provider.rules.vocabulary.OutputRetirement`), else
:class:`OutputRemovedError`; one that holds none is let go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.exceptions import (
    FillRefusedError,
    OutputDeclarationError,
    OutputRemovedError,
    OutputStartRequiredError,
)
from airflow_txn_provider.rules.filling import FillProgress, describe, fill_share, refuse_fill
from airflow_txn_provider.rules.vocabulary import (
    OutputKind,
    OutputRetirement,
    OutputStart,
    SourceKind,
)

FILLING = "filling from history: its fill applies this txid"
"""Why a commit leaves out an output filling from history (its staged rows and files wait)."""

SHOWN_KIND = {OutputKind.STATE: "state", OutputKind.LAKE_SINK: "lake sink"}


@dataclass(frozen=True)
class DeclaredOutput:
    """An output as a declaration (or a commit) names it; ``derived_from``: the state a derived
    state (bucket counts) is computed from at commit time."""

    name: str
    kind: OutputKind
    derived_from: str | None = None


@dataclass(frozen=True)
class OutputRecord:
    """An output as ``txn_output`` records it."""

    name: str
    kind: OutputKind
    complete_from_txid: int | None
    """Every committed txid from this one on is in it, none before (``None``: not recorded)."""
    start: OutputStart | None = None
    declared_at: datetime | None = None
    retired_at: datetime | None = None
    retired_after_txid: int | None = None
    retirement: OutputRetirement | None = None
    live_from_txid: int | None = None
    filled_through: int | None = None
    fill_attempt: int = 0
    joined_after_txid: int | None = None

    @property
    def active(self) -> bool:
        return self.retired_at is None

    @property
    def fill(self) -> FillProgress | None:
        """Its fill from history (joined or not), or ``None``: never filled."""
        if self.start is not OutputStart.HISTORY or self.live_from_txid is None:
            return None
        return FillProgress(
            self.name,
            self.live_from_txid,
            self.filled_through or 0,
            self.fill_attempt,
            self.joined_after_txid,
        )

    @property
    def filling(self) -> bool:
        """Declared to fill from history and not joined yet: the live commits leave it out."""
        return self.active and self.fill is not None and self.fill.filling


@dataclass(frozen=True)
class OutputPlan:
    """What a declaration changes: outputs to record (name -> complete from, choice), outputs
    to retire (name -> keep or drop; a kept one may be dropped later), and outputs to fill from
    history (name -> the first txid the live processing stages them)."""

    new: Mapping[str, tuple[DeclaredOutput, int, OutputStart | None]] = field(default_factory=dict)
    retire: Mapping[str, OutputRetirement] = field(default_factory=dict)
    fill_from: Mapping[str, int] = field(default_factory=dict)


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def choices_text(names: Iterable[str], value: str) -> str:
    return "{" + ", ".join(f"{n!r}: {value!r}" for n in sorted(names)) + "}"


def plan_outputs(
    pipeline: str,
    declared: Iterable[DeclaredOutput],
    recorded: Mapping[str, OutputRecord],
    *,
    begun_through: int,
    last_committed: int,
    start: Mapping[str, OutputStart] | None = None,
    retired: Mapping[str, OutputRetirement] | None = None,
    removals: bool = True,
    source_kind: SourceKind = SourceKind.TRANSACTIONAL,
    replays_exactly: bool = True,
    pruned_through: int = 0,
) -> OutputPlan:
    """What declaring ``declared`` changes, given the ``recorded`` outputs and the newest txid
    begun (``begun_through``, 0: none). Raises a typed error, naming every output concerned and
    what to choose, instead of leaving an output silently partial or deciding its tables' fate.
    ``removals=False``: the outputs ``declared`` are some of the pipeline's (a state created by
    itself), so those it leaves out are not removed. ``source_kind``, ``replays_exactly`` and
    ``pruned_through`` (retention's) decide whether an output may fill from history."""
    start, retired = dict(start or {}), dict(retired or {})
    declared = list(declared)
    both = {o.name for o in declared} & set(retired)
    if both:
        raise OutputDeclarationError(
            f"{_names(both)} both declared and retired: drop them from retired=, or from the "
            "outputs",
            pipeline=pipeline,
            output=", ".join(sorted(both)),
        )
    first_new = begun_through + 1
    new: dict[str, tuple[DeclaredOutput, int, OutputStart | None]] = {}
    fill_from: dict[str, int] = {}
    missing: list[DeclaredOutput] = []
    for out in declared:
        rec = recorded.get(out.name)
        if rec is not None and rec.kind is not out.kind:
            raise OutputDeclarationError(
                f"{out.name!r} is declared as a {SHOWN_KIND[out.kind]}, the log records a "
                f"{SHOWN_KIND[rec.kind]} of that name: give the new output another name",
                pipeline=pipeline,
                output=out.name,
            )
        if rec is not None and rec.active:
            continue
        if rec is not None and rec.retirement is OutputRetirement.KEEP:
            raise OutputDeclarationError(
                f"{SHOWN_KIND[out.kind]} {out.name!r} was retired after txid "
                f"{rec.retired_after_txid} with its tables kept: a new output of that name would "
                "start from its old rows. Name it otherwise, or drop the old tables first "
                f"(retired={choices_text([out.name], OutputRetirement.DROP.value)}, then "
                "declare it)",
                pipeline=pipeline,
                output=out.name,
            )
        choice = start.get(out.name)
        if begun_through == 0:
            new[out.name] = (out, 1, choice)
        elif choice is OutputStart.NEXT_TXID:
            new[out.name] = (out, first_new, choice)
        elif choice is OutputStart.HISTORY:
            why = refuse_fill(
                source_kind, replays_exactly=replays_exactly, pruned_through=pruned_through
            )
            if why is None and out.derived_from is not None:
                why = (
                    f"it is derived from {out.derived_from!r} at each commit, from the committed "
                    "values before the txid: a fill has no such values for past txids. Declare "
                    f"it with {out.derived_from!r} before the pipeline begins, or "
                    'start="next_txid" with it'
                )
            if why is not None:
                raise FillRefusedError(
                    f"{SHOWN_KIND[out.kind]} {out.name!r} cannot be filled from history: {why}",
                    pipeline=pipeline,
                    output=out.name,
                )
            new[out.name] = (out, 1, choice)
            fill_from[out.name] = first_new
        else:
            missing.append(out)
    if missing:
        names = [o.name for o in missing]
        what = ", ".join(f"{SHOWN_KIND[o.kind]} {o.name!r}" for o in missing)
        it = "it" if len(missing) == 1 else "each"
        raise OutputStartRequiredError(
            f"{what} added to a pipeline that has begun txids 1..{begun_through} (last "
            f"committed {last_committed}): {it} would hold only the txids from {first_new} on, "
            f"short of every earlier one. Say how {it} starts: start="
            f"{choices_text(names, OutputStart.NEXT_TXID.value)} (complete from txid {first_new}, "
            "knowingly partial; the log and the Transactions page say so) or "
            f"{choices_text(names, OutputStart.HISTORY.value)} (filled from the committed txids' "
            "batches beside the live pipeline, then joining it: complete from txid 1)",
            pipeline=pipeline,
            output=", ".join(sorted(names)),
        )
    for name, (out, since, _) in new.items():
        source = out.derived_from
        if source is None or since == 1:  # from txid 1 it counts every key its source has
            continue
        if source in fill_from:
            raise OutputDeclarationError(
                f"state {name!r} counts the keys of {source!r}, which fills from history: "
                f"declare {name!r} once {source!r} has joined the live pipeline",
                pipeline=pipeline,
                output=name,
            )
        planned = new.get(source)
        has = planned[1] if planned else getattr(recorded.get(source), "complete_from_txid", None)
        if has != since:
            raise OutputDeclarationError(
                f"state {name!r} counts the keys of {source!r} by their committed values, which "
                f"{'hold txids from ' + str(has) if has else 'are not complete from a known txid'}"
                f": started at txid {since} it would count only the keys that move after it. "
                f"Add it together with {source!r}, or with the pipeline",
                pipeline=pipeline,
                output=name,
            )
    retire: dict[str, OutputRetirement] = {}
    if removals:
        retire = _retirements(pipeline, declared, recorded, last_committed, retired)
    return OutputPlan(new, retire, fill_from)


def _retirements(
    pipeline: str,
    declared: list[DeclaredOutput],
    recorded: Mapping[str, OutputRecord],
    last_committed: int,
    retired: Mapping[str, OutputRetirement],
) -> dict[str, OutputRetirement]:
    names = {o.name for o in declared}
    retire: dict[str, OutputRetirement] = {}
    unsaid = []
    for rec in recorded.values():
        choice = retired.get(rec.name)
        if rec.name in names:
            continue
        if not rec.active:  # retired already: only kept tables may still be dropped
            if rec.retirement is OutputRetirement.KEEP and choice is OutputRetirement.DROP:
                retire[rec.name] = _droppable(pipeline, rec, choice)
            continue
        if choice is None:
            if last_committed >= (rec.complete_from_txid or 1):
                unsaid.append(rec)
                continue
            # Nothing committed into it: a state's tables are empty; a lake table is never ours.
            choice = OutputRetirement.DROP
            if rec.kind is OutputKind.LAKE_SINK:
                choice = OutputRetirement.KEEP
        retire[rec.name] = _droppable(pipeline, rec, choice)
    if unsaid:
        names_ = [r.name for r in unsaid]
        raise OutputRemovedError(
            f"{_names(names_)} no longer declared but holding committed txids (through txid "
            f"{last_committed}): say what becomes of the tables: retired="
            f"{choices_text(names_, OutputRetirement.KEEP.value)} (kept as they are, no longer "
            f"updated) or {choices_text(names_, OutputRetirement.DROP.value)} (a state's tables "
            "dropped)",
            pipeline=pipeline,
            output=", ".join(sorted(names_)),
        )
    for rec in recorded.values():  # a derived state still declared needs its source
        derived = [o.name for o in declared if o.derived_from == rec.name]
        if rec.name in retire and derived:
            raise OutputDeclarationError(
                f"state {rec.name!r} is retired while {_names(derived)} still derive from it",
                pipeline=pipeline,
                output=rec.name,
            )
    return retire


def _droppable(pipeline: str, rec: OutputRecord, choice: OutputRetirement) -> OutputRetirement:
    if choice is OutputRetirement.DROP and rec.kind is OutputKind.LAKE_SINK:
        raise OutputDeclarationError(
            f"lake sink {rec.name!r}: the provider never drops a lake table (other readers, "
            "time travel): retire it with 'keep', and delete the table with the lake's own tools "
            "if it must go",
            pipeline=pipeline,
            output=rec.name,
        )
    return choice


def skipped_at_commit(
    pipeline: str,
    txid: int,
    attempt: int,
    given: Iterable[DeclaredOutput],
    recorded: Mapping[str, OutputRecord],
) -> tuple[dict[str, str], list[DeclaredOutput]]:
    """At the commit of ``(txid, attempt)`` with the outputs ``given``: those it must not be
    applied to (name -> why: complete from a later txid, or filling from history, its fill to
    apply this txid), and those to record now as complete from txid 1 (never declared, and
    ``txid`` is 1: nothing came before). An output never declared at a later txid, or retired,
    is refused: it would be silently partial."""
    skipped: dict[str, str] = {}
    first: list[DeclaredOutput] = []
    for out in given:
        rec = recorded.get(out.name)
        if rec is None and txid == 1:
            first.append(out)
        elif rec is None or not rec.active:
            how = "was retired" if rec else f"was never declared (txids before {txid} committed)"
            raise OutputStartRequiredError(
                f"{SHOWN_KIND[out.kind]} {out.name!r} {how}: committing into it would make it "
                "silently partial. Declare it (ensure_pipeline / TxnPipeline, with start="
                f"{choices_text([out.name], OutputStart.NEXT_TXID.value)})",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
                output=out.name,
            )
        elif rec.filling:
            skipped[out.name] = FILLING
        elif rec.complete_from_txid is not None and txid < rec.complete_from_txid:
            skipped[out.name] = f"complete from txid {rec.complete_from_txid}"
    return skipped, first


def completeness(rec: OutputRecord, last_committed: int = 0) -> dict[str, Any]:
    """What the Transactions page and the health endpoint say of an output (plain JSON):
    ``complete`` is the sentence, ``partial`` whether txids before ``complete_from_txid`` are
    missing from it (``None``: not recorded); a filling output's ``fill`` its progress against
    the pipeline's ``last_committed`` txid."""
    since = rec.complete_from_txid
    fill = rec.fill
    if fill is not None:
        text_ = describe(fill, last_committed)
    elif since is None:
        text_ = "complete from: not recorded (declared by an earlier version while it ran)"
    elif since == 1:
        text_ = "complete from txid 1"
    else:
        text_ = f"complete from txid {since} (txids 1..{since - 1} are not in it)"
    if not rec.active:
        kept = "tables kept" if rec.retirement is OutputRetirement.KEEP else "tables dropped"
        text_ = f"retired after txid {rec.retired_after_txid} ({kept}); was {text_}"
    return {
        "name": rec.name,
        "kind": rec.kind.value,
        "start": rec.start.value if rec.start else None,
        "complete_from_txid": since,
        "partial": None if since is None else since > 1 or rec.filling,
        "complete": text_,
        "declared_at": _iso(rec.declared_at),
        "retired": not rec.active,
        "retired_at": _iso(rec.retired_at),
        "retired_after_txid": rec.retired_after_txid,
        "retirement": rec.retirement.value if rec.retirement else None,
        "filling": rec.filling,
        "fill": None
        if fill is None
        else {
            "live_from_txid": fill.live_from,
            "filled_through": fill.filled_through,
            "share": fill_share(fill, last_committed),
            "joined_after_txid": fill.joined_after,
        },
    }


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat()


__all__ = [
    "FILLING",
    "SHOWN_KIND",
    "DeclaredOutput",
    "OutputPlan",
    "OutputRecord",
    "choices_text",
    "completeness",
    "plan_outputs",
    "skipped_at_commit",
]
