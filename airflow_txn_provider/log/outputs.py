"""A pipeline's outputs, its states and lake sinks: from which txid each is complete, how one
joins a pipeline that has begun txids, and how one leaves (``txn_output``, migration 0011).

An output declared before its pipeline began any txid holds every txid: complete from txid 1.
One added later would hold only the txids after it, short of all history, so the declaration
must say so (:class:`~airflow_txn_provider.rules.vocabulary.OutputStart`: ``start={name:
"next_txid"}``), or it is refused (:class:`OutputStartRequiredError`). It then holds exactly the
txids from the next one to begin on, ``N``: every txid from ``N`` on began after it was declared
(a begin takes the pipeline's lock, which the declaration holds), so its processing knew the
output; a txid below ``N`` that commits later (one in flight, one replayed, a rewind's) is not
applied to it (:func:`skipped_at_commit`). The log records ``N`` (``complete_from_txid``); the
Transactions page and the health endpoint show it for every output (:func:`completeness`).

An output the declaration no longer names is retired by the choice ``retired={name: "keep" |
"drop"}`` (:class:`~airflow_txn_provider.rules.vocabulary.OutputRetirement`); without one, removing
an output that holds committed txids is refused (:class:`OutputRemovedError`), and one that holds
none is let go without asking (a state's empty tables dropped, a lake table never touched).

The rules (:func:`plan_outputs`, :func:`skipped_at_commit`, :func:`completeness`) are pure; the
rest reads and writes ``txn_output`` inside its caller's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.models import OUTPUTS, PIPELINES, STATE_REGISTRY, TRANSACTIONS
from airflow_txn_provider.rules.exceptions import (
    OutputDeclarationError,
    OutputRemovedError,
    OutputStartRequiredError,
)
from airflow_txn_provider.rules.vocabulary import OutputKind, OutputRetirement, OutputStart

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)

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

    @property
    def active(self) -> bool:
        return self.retired_at is None


@dataclass(frozen=True)
class OutputPlan:
    """What a declaration changes: outputs to record (name -> complete from, choice) and
    outputs to retire (name -> keep or drop; a kept one may be dropped later)."""

    new: Mapping[str, tuple[DeclaredOutput, int, OutputStart | None]] = field(default_factory=dict)
    retire: Mapping[str, OutputRetirement] = field(default_factory=dict)


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def _choices(names: Iterable[str], value: str) -> str:
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
) -> OutputPlan:
    """What declaring ``declared`` changes, given the ``recorded`` outputs and the newest txid
    begun (``begun_through``, 0: none). Raises a typed error, naming every output concerned and
    what to choose, instead of leaving an output silently partial or deciding its tables' fate.
    ``removals=False``: the outputs ``declared`` are some of the pipeline's (a state created by
    itself), so those it leaves out are not removed."""
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
                f"start from its old rows. Name it otherwise, or drop the old tables first "
                f"(retired={_choices([out.name], OutputRetirement.DROP.value)}, then declare it)",
                pipeline=pipeline,
                output=out.name,
            )
        choice = start.get(out.name)
        if begun_through == 0:
            new[out.name] = (out, 1, choice)
        elif choice is OutputStart.NEXT_TXID:
            new[out.name] = (out, first_new, choice)
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
            f"{_choices(names, OutputStart.NEXT_TXID.value)} (complete from txid {first_new}, "
            "knowingly partial; the log and the Transactions page say so)",
            pipeline=pipeline,
            output=", ".join(sorted(names)),
        )
    for name, (out, since, _) in new.items():
        source = out.derived_from
        if source is None or since == 1:  # from txid 1 it counts every key its source has
            continue
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
    return OutputPlan(new, retire)


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
            f"{_choices(names_, OutputRetirement.KEEP.value)} (kept as they are, no longer "
            f"updated) or {_choices(names_, OutputRetirement.DROP.value)} (a state's tables "
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
) -> tuple[dict[str, int], list[DeclaredOutput]]:
    """At the commit of ``(txid, attempt)`` with the outputs ``given``: those it must not be
    applied to (name -> the txid they are complete from, above ``txid``), and those to record
    now as complete from txid 1 (never declared, and ``txid`` is 1: nothing came before). An
    output never declared at a later txid, or retired, is refused: it would be silently
    partial."""
    skipped: dict[str, int] = {}
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
                f"{_choices([out.name], OutputStart.NEXT_TXID.value)})",
                pipeline=pipeline,
                txid=txid,
                attempt=attempt,
                output=out.name,
            )
        elif rec.complete_from_txid is not None and txid < rec.complete_from_txid:
            skipped[out.name] = rec.complete_from_txid
    return skipped, first


def completeness(rec: OutputRecord) -> dict[str, Any]:
    """What the Transactions page and the health endpoint say of an output (plain JSON):
    ``complete`` is the sentence, ``partial`` whether txids before ``complete_from_txid`` are
    missing from it (``None``: not recorded)."""
    since = rec.complete_from_txid
    if since is None:
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
        "partial": None if since is None else since > 1,
        "complete": text_,
        "declared_at": _iso(rec.declared_at),
        "retired": not rec.active,
        "retired_at": _iso(rec.retired_at),
        "retired_after_txid": rec.retired_after_txid,
        "retirement": rec.retirement.value if rec.retirement else None,
    }


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat()


# -- the rows ------------------------------------------------------------------------------------


def read_outputs(conn: Connection, pipeline: str) -> dict[str, OutputRecord]:
    """Every output ``txn_output`` records for ``pipeline`` (retired ones too), by name."""
    rows = conn.execute(
        select(OUTPUTS).where(OUTPUTS.c.pipeline == pipeline).order_by(OUTPUTS.c.name)
    ).all()
    return {
        r.name: OutputRecord(
            r.name,
            r.kind,
            r.complete_from_txid,
            r.start,
            r.declared_at,
            r.retired_at,
            r.retired_after_txid,
            r.retirement,
        )
        for r in rows
    }


def read_completeness(conn: Connection, pipeline: str) -> list[dict[str, Any]]:
    """:func:`completeness` of every output of ``pipeline``, by name (the page's, the health
    endpoint's)."""
    return [completeness(rec) for rec in read_outputs(conn, pipeline).values()]


def lock_progress(conn: Connection, pipeline: str) -> tuple[int, int]:
    """``(newest txid begun, last committed)`` of ``pipeline``, its row locked until ``conn``'s
    transaction ends, so no txid begins meanwhile (``(0, 0)``: not registered yet)."""
    query = select(PIPELINES.c.last_committed_txid).where(PIPELINES.c.name == pipeline)
    last = conn.execute(query.with_for_update()).scalar_one_or_none()
    if last is None:
        return 0, 0
    newest = conn.execute(
        select(func.max(TRANSACTIONS.c.txid)).where(TRANSACTIONS.c.pipeline == pipeline)
    ).scalar()
    return max(int(newest or 0), int(last)), int(last)


def declare_outputs(
    conn: Connection,
    pipeline: str,
    declared: Iterable[DeclaredOutput],
    *,
    start: Mapping[str, OutputStart] | None = None,
    retired: Mapping[str, OutputRetirement] | None = None,
    removals: bool = True,
) -> OutputPlan:
    """Plan (:func:`plan_outputs`, under the pipeline's lock) and write it: the new outputs'
    rows and the retirements, a retired state's registration deleted (and its tables dropped if
    so chosen). Run it in the transaction that creates the states' tables, after the DDL lock
    (:func:`~airflow_txn_provider.state.backing.lock_ddl`): DDL, then pipeline, for everyone."""
    declared = list(declared)
    recorded = read_outputs(conn, pipeline)
    known = all(o.name in recorded and recorded[o.name].active for o in declared)
    if known and not removals and not retired:
        return OutputPlan()  # a state created again: no lock
    begun, last = lock_progress(conn, pipeline)
    plan = plan_outputs(
        pipeline,
        declared,
        recorded,
        begun_through=begun,
        last_committed=last,
        start=start,
        retired=retired,
        removals=removals,
    )
    for name, (out, since, choice) in plan.new.items():
        if out.kind is OutputKind.STATE:
            _refuse_kept_elsewhere(conn, pipeline, name)
        values = {"kind": out.kind, "start": choice, "complete_from_txid": since}
        nulls = {"retired_at": None, "retired_after_txid": None, "retirement": None}
        conn.execute(
            pg_insert(OUTPUTS)
            .values(pipeline=pipeline, name=name, **values)
            .on_conflict_do_update(
                index_elements=["pipeline", "name"],
                set_={**values, **nulls, "declared_at": func.now()},
            )
        )
        log.info("pipeline=%s output %s declared, complete from txid %s", pipeline, name, since)
    for name, retirement in plan.retire.items():
        _retire(conn, pipeline, recorded[name], retirement, last)
    return plan


def _refuse_kept_elsewhere(conn: Connection, pipeline: str, name: str) -> None:
    """State names are global (their tables are ``txn_state_<name>``): a state another pipeline
    retired with its tables kept still owns them."""
    other = conn.execute(
        select(OUTPUTS.c.pipeline).where(
            (OUTPUTS.c.name == name)
            & (OUTPUTS.c.pipeline != pipeline)
            & (OUTPUTS.c.kind == OutputKind.STATE)
            & (OUTPUTS.c.retirement == OutputRetirement.KEEP)
        )
    ).first()
    if other is not None:
        raise OutputDeclarationError(
            f"state {name!r}: pipeline {other.pipeline!r} retired a state of that name with its "
            "tables kept: name it otherwise, or drop them there (retired="
            f"{_choices([name], OutputRetirement.DROP.value)})",
            pipeline=pipeline,
            output=name,
        )


def _retire(
    conn: Connection, pipeline: str, rec: OutputRecord, choice: OutputRetirement, last: int
) -> None:
    if rec.kind is OutputKind.STATE:
        conn.execute(
            STATE_REGISTRY.delete().where(
                (STATE_REGISTRY.c.name == rec.name) & (STATE_REGISTRY.c.pipeline == pipeline)
            )
        )
        if choice is OutputRetirement.DROP:
            from airflow_txn_provider.rules.names import quote_ident, state_tables

            for table in state_tables(rec.name):
                conn.execute(text(f"DROP TABLE IF EXISTS {quote_ident(table)}"))
    values: dict[str, Any] = {"retirement": choice}
    if rec.active:
        values.update(retired_at=func.now(), retired_after_txid=last)
    conn.execute(
        update(OUTPUTS)
        .where((OUTPUTS.c.pipeline == pipeline) & (OUTPUTS.c.name == rec.name))
        .values(values)
    )
    log.warning(
        "pipeline=%s output %s retired after txid %s, tables %s",
        pipeline,
        rec.name,
        values.get("retired_after_txid", rec.retired_after_txid),
        "kept" if choice is OutputRetirement.KEEP else "dropped",
    )


def record_first(conn: Connection, pipeline: str, outputs: Iterable[DeclaredOutput]) -> None:
    """Record ``outputs`` as complete from txid 1, at txid 1's commit (never declared, so a
    commit names them: the core API's way)."""
    for out in outputs:
        conn.execute(
            pg_insert(OUTPUTS)
            .values(pipeline=pipeline, name=out.name, kind=out.kind, complete_from_txid=1)
            .on_conflict_do_nothing()
        )


__all__ = [
    "DeclaredOutput",
    "OutputPlan",
    "OutputRecord",
    "completeness",
    "declare_outputs",
    "lock_progress",
    "plan_outputs",
    "read_completeness",
    "read_outputs",
    "record_first",
    "skipped_at_commit",
]
