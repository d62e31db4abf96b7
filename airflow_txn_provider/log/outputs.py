"""A pipeline's outputs in the log: ``txn_output``'s rows (migration 0011), read and written
inside the caller's transaction. The rules they follow (from which txid an output is complete,
how one joins a running pipeline or fills from history, how one leaves) are
:mod:`airflow_txn_provider.rules.outputs`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from airflow_txn_provider.log.models import OUTPUTS, PIPELINES, STATE_REGISTRY, TRANSACTIONS
from airflow_txn_provider.rules.exceptions import OutputDeclarationError
from airflow_txn_provider.rules.names import as_of_function, quote_ident, state_tables
from airflow_txn_provider.rules.outputs import (
    DeclaredOutput,
    OutputPlan,
    OutputRecord,
    choices_text,
    completeness,
    plan_outputs,
)
from airflow_txn_provider.rules.vocabulary import (
    OutputKind,
    OutputRetirement,
    OutputStart,
    SourceKind,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)


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
            r.live_from_txid,
            r.filled_through,
            r.fill_attempt,
            r.joined_after_txid,
        )
        for r in rows
    }


def read_completeness(conn: Connection, pipeline: str) -> list[dict[str, Any]]:
    """:func:`completeness` of every output of ``pipeline``, by name (the page's, the health
    endpoint's)."""
    last = conn.execute(
        select(PIPELINES.c.last_committed_txid).where(PIPELINES.c.name == pipeline)
    ).scalar()
    return [completeness(rec, int(last or 0)) for rec in read_outputs(conn, pipeline).values()]


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
    replays_exactly: bool | None = None,
) -> OutputPlan:
    """Plan (:func:`plan_outputs`, under the pipeline's lock) and write it: the new outputs'
    rows and the retirements, a retired state's registration deleted (and its tables dropped if
    so chosen). Run it in the transaction that creates the states' tables, after the DDL lock
    (:func:`~airflow_txn_provider.state.backing.lock_ddl`): DDL, then pipeline, for everyone.
    ``replays_exactly``: whether the pipeline's source reads a committed batch again exactly
    (``None``: as its kind says, a transactional one does)."""
    declared = list(declared)
    recorded = read_outputs(conn, pipeline)
    known = all(o.name in recorded and recorded[o.name].active for o in declared)
    if known and not removals and not retired:
        return OutputPlan()  # a state created again: no lock
    begun, last = lock_progress(conn, pipeline)
    row = conn.execute(
        select(PIPELINES.c.source_kind, PIPELINES.c.pruned_through_txid).where(
            PIPELINES.c.name == pipeline
        )
    ).first()
    source_kind = SourceKind(row.source_kind) if row else SourceKind.TRANSACTIONAL
    if replays_exactly is None:
        replays_exactly = source_kind is SourceKind.TRANSACTIONAL
    plan = plan_outputs(
        pipeline,
        declared,
        recorded,
        begun_through=begun,
        last_committed=last,
        start=start,
        retired=retired,
        removals=removals,
        source_kind=source_kind,
        replays_exactly=replays_exactly,
        pruned_through=int(row.pruned_through_txid) if row else 0,
    )
    for name, (out, since, choice) in plan.new.items():
        if out.kind is OutputKind.STATE:
            _refuse_kept_elsewhere(conn, pipeline, name)
        live_from = plan.fill_from.get(name)
        values = {
            "kind": out.kind,
            "start": choice,
            "complete_from_txid": since,
            "live_from_txid": live_from,
            "filled_through": None if live_from is None else 0,
        }
        nulls = {
            "retired_at": None,
            "retired_after_txid": None,
            "retirement": None,
            "joined_after_txid": None,
        }
        conn.execute(
            pg_insert(OUTPUTS)
            .values(pipeline=pipeline, name=name, **values)
            .on_conflict_do_update(
                index_elements=["pipeline", "name"],
                set_={**values, **nulls, "declared_at": func.now()},
            )
        )
        if live_from is None:
            log.info("pipeline=%s output %s declared, complete from txid %s", pipeline, name, since)
        else:
            log.warning(
                "pipeline=%s output %s declared, filling from history: txids 1..%s by its fill, "
                "staged by the live processing from txid %s on",
                pipeline,
                name,
                last,
                live_from,
            )
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
            f"{choices_text([name], OutputRetirement.DROP.value)})",
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
            for table in state_tables(rec.name):
                conn.execute(text(f"DROP TABLE IF EXISTS {quote_ident(table)}"))
            reads = quote_ident(as_of_function(rec.name))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {reads}(bigint)"))
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


def record_complete_from_txid_1(
    conn: Connection, pipeline: str, outputs: Iterable[DeclaredOutput]
) -> None:
    """Record ``outputs`` as complete from txid 1, at txid 1's commit (never declared, so a
    commit names them: the core API's way)."""
    for out in outputs:
        conn.execute(
            pg_insert(OUTPUTS)
            .values(pipeline=pipeline, name=out.name, kind=out.kind, complete_from_txid=1)
            .on_conflict_do_nothing()
        )


__all__ = [
    "declare_outputs",
    "lock_progress",
    "read_completeness",
    "read_outputs",
    "record_complete_from_txid_1",
]
