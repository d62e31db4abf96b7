"""The state registry, ``txn_state_registry``: which pipeline owns which state, declared how.

One row a state: its name, pipeline, kind and definition (keys, value type, combiner, …). A
state is registered when its tables are created, and a declaration that contradicts the row is
refused: a state belongs to one pipeline and keeps its definition. The commit and Spark jobs
read the rows back to know a pipeline's states (turned into states by
:func:`~airflow_txn_provider.state.maps.load_states`, which knows the state classes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from airflow_txn_provider.log.models import STATE_REGISTRY
from airflow_txn_provider.log.outputs import declare_outputs
from airflow_txn_provider.rules.exceptions import StateDefinitionError
from airflow_txn_provider.rules.outputs import DeclaredOutput
from airflow_txn_provider.rules.vocabulary import OutputKind, OutputStart

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement
    from sqlalchemy.engine import Connection, Engine

    from airflow_txn_provider.rules.vocabulary import StateKind


def register_state(
    conn: Connection,
    name: str,
    pipeline: str,
    kind: StateKind,
    definition: Mapping[str, Any],
    start: OutputStart | str | None = None,
) -> None:
    """Register the state ``name`` of ``pipeline`` unless registered; refuse a registered one
    of another pipeline or definition (:class:`StateDefinitionError`). A new one is recorded as
    an output of the pipeline, complete from txid 1 or, if the pipeline has begun txids, from
    the next one with ``start="next_txid"`` (:func:`~airflow_txn_provider.log.outputs.
    declare_outputs`; without it, :class:`~airflow_txn_provider.rules.exceptions.
    OutputStartRequiredError`)."""
    conn.execute(
        pg_insert(STATE_REGISTRY)
        .values(name=name, pipeline=pipeline, kind=kind, definition=definition)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    row = conn.execute(
        select(STATE_REGISTRY.c.pipeline, STATE_REGISTRY.c.definition).where(
            STATE_REGISTRY.c.name == name
        )
    ).one()
    if row.pipeline != pipeline or row.definition != definition:
        raise StateDefinitionError(
            f"state {name!r} exists as {row.definition} of pipeline {row.pipeline!r}; "
            f"declared as {definition} of pipeline {pipeline!r}",
            pipeline=pipeline,
        )
    derived = definition.get("bucket_counts_of")
    declare_outputs(
        conn,
        pipeline,
        [DeclaredOutput(name, OutputKind.STATE, derived)],
        start={name: OutputStart(start)} if start else None,
        removals=False,
    )


def named(name: str) -> ColumnElement[bool]:
    """Which rows :func:`registered` reads: the state ``name``."""
    return STATE_REGISTRY.c.name == name


def of_pipeline(pipeline: str) -> ColumnElement[bool]:
    """Which rows :func:`registered` reads: every state of ``pipeline``."""
    return STATE_REGISTRY.c.pipeline == pipeline


def registered(
    bind: Engine | Connection, where: ColumnElement[bool]
) -> list[tuple[str, str, Mapping[str, Any]]]:
    """``(pipeline, name, definition)`` of the registered states ``where`` selects, by name."""
    from sqlalchemy.engine import Engine

    query = select(STATE_REGISTRY).where(where).order_by(STATE_REGISTRY.c.name)
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            rows = conn.execute(query).all()
    else:
        rows = bind.execute(query).all()
    return [(row.pipeline, row.name, row.definition) for row in rows]
