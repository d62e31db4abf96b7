"""Declaring a pipeline to the log: its registration, its outputs, and the DAGs that run it.

A pipeline is declared by its source's kind, its window, its retention and its outputs (states
and lake sinks, with the choices for those added or removed while it runs:
:mod:`airflow_txn_provider.log.outputs`), as :class:`~airflow_txn_provider.pipeline.TxnPipeline`
says. Every begin declares it again, so a declaration the log holds already costs one read (its
fingerprint), with no lock and no DDL; only a changed one registers again. Kept apart from the
transitions, which never change a declaration (:class:`PipelineDeclarations` is a part of
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import delete, exists, func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from airflow_txn_provider import __version__
from airflow_txn_provider.log import schema
from airflow_txn_provider.log.models import PIPELINE_DAGS, PIPELINES
from airflow_txn_provider.log.outputs import declare_outputs
from airflow_txn_provider.log.part import LogPart
from airflow_txn_provider.log.rows import lock_pipeline
from airflow_txn_provider.rules.config import (
    DEFAULT_KEEP_TXIDS,
    FIRST_WINDOW,
    fitted_window,
    validate_keep_txids,
    validate_max_pending,
)
from airflow_txn_provider.rules.exceptions import PipelineConfigError
from airflow_txn_provider.rules.outputs import DeclaredOutput
from airflow_txn_provider.rules.vocabulary import (
    OutputKind,
    OutputRetirement,
    OutputStart,
    SourceKind,
)
from airflow_txn_provider.state.backing import lock_ddl
from airflow_txn_provider.utils.retries import retry_transient

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)


class DeclaredState(Protocol):
    """What :meth:`TransactionLog.ensure_pipeline` needs of a state (``MapState`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def derived_from(self) -> str | None: ...

    def definition(self) -> Mapping[str, Any]: ...

    def create(self, bind: Connection, *, start: OutputStart | None = None) -> Any: ...


class DeclaredSink(Protocol):
    """What :meth:`TransactionLog.ensure_pipeline` needs of a lake sink (``LakeSink`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...


def output_choices(
    start: Mapping[str, OutputStart | str] | None,
    retired: Mapping[str, OutputRetirement | str] | None,
) -> tuple[dict[str, OutputStart], dict[str, OutputRetirement]]:
    """The declaration's choices for its outputs, checked (``ValueError`` names the choices)."""

    def check(choices: Mapping[str, Any] | None, enum: Any, what: str) -> dict[str, Any]:
        try:
            return {str(n): enum(v) for n, v in (choices or {}).items()}
        except ValueError:
            allowed = [m.value for m in enum]
            raise ValueError(
                f"{what} takes {{output name: one of {allowed}}}, got {choices!r}"
            ) from None

    return check(start, OutputStart, "start"), check(retired, OutputRetirement, "retired")


def declaration_fingerprint(
    source_kind: SourceKind | str,
    max_pending: int | None,
    dag_id: str | None,
    states: Sequence[DeclaredState],
    keep_txids: int = DEFAULT_KEEP_TXIDS,
    sinks: Sequence[DeclaredSink] = (),
    start: Mapping[str, OutputStart | str] | None = None,
    retired: Mapping[str, OutputRetirement | str] | None = None,
) -> str:
    """A digest of everything registration writes, and of this library's version (a new version
    may add to the state tables' DDL): equal digests, nothing to register again."""
    starts, retirements = output_choices(start, retired)
    declared = {
        "library": __version__,
        "schema": schema.HEAD_REVISION,
        "source_kind": SourceKind(source_kind).value,
        "max_pending": max_pending,
        "keep_txids": keep_txids,
        "dag_id": dag_id,
        "states": [[s.name, dict(s.definition())] for s in states],
        "sinks": [[s.name, s.kind] for s in sinks],
        "start": {n: c.value for n, c in starts.items()},
        "retired": {n: c.value for n, c in retirements.items()},
    }
    return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()


class PipelineDeclarations(LogPart):
    """The log's pipelines as declared: registering one, and which DAGs run it."""

    @retry_transient
    def register_pipeline(
        self,
        name: str,
        *,
        source_kind: SourceKind | str,
        max_pending: int | None,
        dag_id: str | None = None,
        keep_txids: int | None = None,
    ) -> None:
        """Create the pipeline, or check an existing one (its ``max_pending`` and ``keep_txids``
        may change).

        :param max_pending: the window; ``None``: it fits the pipeline's Spark
            (:meth:`fit_window`), ``FIRST_WINDOW`` until a txid has seen it, and an existing
            pipeline keeps the window it has until then.
        :param dag_id: the Airflow DAG that runs it, recorded for the Transactions page.
        :param keep_txids: retention: how many of the newest committed txids keep their rows
            (``None``: leave it as it is; a new pipeline gets ``DEFAULT_KEEP_TXIDS``).
        """
        if not name or len(name) > 250:
            raise ValueError(f"pipeline name must have 1 to 250 characters, got {name!r}")
        kind = SourceKind(source_kind)
        validate_max_pending(max_pending)
        if keep_txids is not None:
            validate_keep_txids(keep_txids)
        with self.engine.begin() as conn:
            conn.execute(
                pg_insert(PIPELINES)
                .values(
                    name=name,
                    source_kind=kind,
                    max_pending=max_pending or FIRST_WINDOW,
                    keep_txids=keep_txids or DEFAULT_KEEP_TXIDS,
                )
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = lock_pipeline(conn, name)
            if row.source_kind is not kind:
                raise PipelineConfigError(
                    f"pipeline was registered with a {row.source_kind} source, now declared "
                    f"{kind.value}; a running pipeline cannot change its replay semantics",
                    pipeline=name,
                )
            if dag_id:
                conn.execute(
                    pg_insert(PIPELINE_DAGS)
                    .values(pipeline=name, dag_id=dag_id)
                    .on_conflict_do_nothing()
                )
            for setting, value in (("max_pending", max_pending), ("keep_txids", keep_txids)):
                if value is None or getattr(row, setting) == value:
                    continue
                conn.execute(
                    update(PIPELINES)
                    .where(PIPELINES.c.name == name)
                    .values({setting: value, "updated_at": func.now()})
                )
                log.info(
                    "pipeline=%s %s changed from %s to %s",
                    name,
                    setting,
                    getattr(row, setting),
                    value,
                )

    def ensure_pipeline(
        self,
        name: str,
        *,
        source_kind: SourceKind | str,
        max_pending: int | None,
        dag_id: str | None = None,
        states: Sequence[DeclaredState] = (),
        keep_txids: int = DEFAULT_KEEP_TXIDS,
        sinks: Sequence[DeclaredSink] = (),
        start: Mapping[str, OutputStart | str] | None = None,
        retired: Mapping[str, OutputRetirement | str] | None = None,
        replays_exactly: bool | None = None,
    ) -> bool:
        """Register the pipeline and declare its outputs (states and lake sinks), unless the log
        holds this very declaration already: then it is one read, with no lock and no DDL (every
        begin calls it, each no-data poll included). Returns whether it registered.

        An output new to a pipeline that has begun txids needs ``start={name: "next_txid"}``,
        and one it no longer names that holds committed txids ``retired={name: "keep" |
        "drop"}`` (:mod:`airflow_txn_provider.log.outputs`); otherwise
        :class:`~airflow_txn_provider.rules.exceptions.OutputStartRequiredError` or
        :class:`~airflow_txn_provider.rules.exceptions.OutputRemovedError`, and no output
        changes. ``replays_exactly``: whether the source reads a committed txid's batch again
        exactly (``None``: a transactional source does, an opaque one not), which filling an
        output from history (``start={name: "history"}``) needs."""
        declaration = declaration_fingerprint(
            source_kind, max_pending, dag_id, states, keep_txids, sinks, start, retired
        )
        if self._declaration(name, dag_id) == declaration:
            return False
        self.register_pipeline(
            name,
            source_kind=source_kind,
            max_pending=max_pending,
            dag_id=dag_id,
            keep_txids=keep_txids,
        )
        self._declare_outputs(
            name, states, sinks, *output_choices(start, retired), replays_exactly=replays_exactly
        )
        self._set_declaration(name, declaration)
        log.info("pipeline=%s registered (declaration %s)", name, declaration[:12])
        return True

    @retry_transient
    def _declare_outputs(
        self,
        name: str,
        states: Sequence[DeclaredState],
        sinks: Sequence[DeclaredSink],
        start: Mapping[str, OutputStart],
        retired: Mapping[str, OutputRetirement],
        *,
        replays_exactly: bool | None = None,
    ) -> None:
        """Every output in one transaction: the plan checked whole before anything changes, and
        every new output complete from the same txid. The DDL lock first: the order a state's
        creation takes its locks in (DDL, then the pipeline's row)."""
        declared = [DeclaredOutput(s.name, OutputKind.STATE, s.derived_from) for s in states]
        declared += [DeclaredOutput(s.name, OutputKind.LAKE_SINK) for s in sinks]
        with self.engine.begin() as conn:
            lock_ddl(conn)
            declare_outputs(
                conn, name, declared, start=start, retired=retired, replays_exactly=replays_exactly
            )
            # a derived state after the state it is computed from
            for state in sorted(states, key=lambda s: s.derived_from is not None):
                state.create(conn, start=start.get(state.name))

    @retry_transient
    def fit_window(self, name: str, spark_cores: int) -> bool:
        """Set the window of a pipeline that declares no ``max_pending`` to the one that fits a
        Spark of ``spark_cores`` cores (:func:`~airflow_txn_provider.rules.config.fitted_window`),
        as its txids see it; returns whether it changed. One UPDATE that matches (and locks) no
        row when the window fits already (every txid asks: a cluster grows and shrinks)."""
        window = fitted_window(spark_cores)
        with self.engine.begin() as conn:
            changed = conn.execute(
                update(PIPELINES)
                .where(PIPELINES.c.name == name, PIPELINES.c.max_pending != window)
                .values(max_pending=window, updated_at=func.now())
            ).rowcount
        if changed:
            log.info(
                "pipeline=%s window fitted to its Spark's %s cores: %s txids in flight",
                name,
                spark_cores,
                window,
            )
        return bool(changed)

    @retry_transient
    def _declaration(self, name: str, dag_id: str | None = None) -> str | None:
        """The pipeline's stored declaration; ``None`` while the log holds no pairing of it with
        ``dag_id`` (deleted by :meth:`forget_pipeline_dags` while the DAG ran another pipeline):
        registering again records it."""
        query = select(PIPELINES.c.declaration).where(PIPELINES.c.name == name)
        if dag_id:
            paired = (PIPELINE_DAGS.c.pipeline == name) & (PIPELINE_DAGS.c.dag_id == dag_id)
            query = query.where(exists().where(paired))
        with self.engine.connect() as conn:
            return conn.execute(query).scalar()

    @retry_transient
    def _set_declaration(self, name: str, declaration: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(PIPELINES).where(PIPELINES.c.name == name).values(declaration=declaration)
            )

    @retry_transient
    def pipeline_dags(self) -> dict[str, set[str]]:
        """Pipeline -> ids of the Airflow DAGs recorded as running it."""
        found: dict[str, set[str]] = {}
        with self.engine.connect() as conn:
            for pipeline, dag_id in conn.execute(
                select(PIPELINE_DAGS.c.pipeline, PIPELINE_DAGS.c.dag_id)
            ):
                found.setdefault(pipeline, set()).add(dag_id)
        return found

    @retry_transient
    def forget_pipeline_dags(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Delete these ``(pipeline, dag_id)`` pairings: their DAG was deleted, or its id runs
        another pipeline now (the rule is the Transactions page's,
        :func:`airflow_txn_provider.ui.reader.pipeline_dags`). Returns how many there were."""
        pairs = sorted(set(pairs))
        if not pairs:
            return 0
        pair = tuple_(PIPELINE_DAGS.c.pipeline, PIPELINE_DAGS.c.dag_id)
        with self.engine.begin() as conn:
            return conn.execute(delete(PIPELINE_DAGS).where(pair.in_(pairs))).rowcount
