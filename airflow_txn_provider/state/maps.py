"""The map states users declare (:class:`MapState`, :class:`GlobalState`,
:class:`BucketCountState`), after Trident's ``TransactionalMap`` and ``OpaqueMap`` over one
small backing map.

A state is a handle composed of four parts, each in its own module: its tables
(:mod:`~airflow_txn_provider.state.backing`: DDL, stage, apply, read), its kind's rule
(:mod:`~airflow_txn_provider.state.kinds`), its registry row
(:mod:`~airflow_txn_provider.state.registry`) and, for a keyed state, its summary
(:mod:`~airflow_txn_provider.state.summary`). This module checks the declaration, ties the parts
together in the order the package's docstring (:mod:`airflow_txn_provider.state`) tells, and
turns what the tables refuse into the log's typed errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy.exc import DataError

from airflow_txn_provider.rules.exceptions import (
    MalformedOutputError,
    StagedOutputMismatchError,
    StateAheadOfLogError,
    StateDefinitionError,
    StateValueOutOfRangeError,
    TxnError,
)
from airflow_txn_provider.rules.names import SQL_NAME, check_name
from airflow_txn_provider.rules.vocabulary import OutputStart, StateKind
from airflow_txn_provider.state.as_of import AsOfReads, GlobalAsOfReads, create_as_of_function
from airflow_txn_provider.state.backing import (
    BackingTable,
    check_columns,
    check_table_names,
    lock_ddl,
)
from airflow_txn_provider.state.kinds import KindRule, rule_for
from airflow_txn_provider.state.registry import named, of_pipeline, register_state, registered
from airflow_txn_provider.state.staging import Refused, arrow_rows, check_rows
from airflow_txn_provider.state.summary import (
    count_summary_once,
    read_summary,
    start_summary,
    summary_upkeep_cte,
    top_keys,
)
from airflow_txn_provider.state.undo import UndoRecords
from airflow_txn_provider.utils.retries import sqlstate

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy import ColumnElement
    from sqlalchemy.engine import Connection, Engine

_log = logging.getLogger(__name__)

NUMERIC_OUT_OF_RANGE = "22003"


def _ident(value: str, what: str) -> str:
    return check_name(value, SQL_NAME, what=what)


@dataclass(frozen=True)
class ApplyResult:
    staged_rows: int
    keys: int


@dataclass(frozen=True, eq=False)  # identity equality: a state is a handle, usable as a dict key
class MapState(AsOfReads):
    """A Postgres map state of one pipeline.

    :param pipeline: the pipeline whose txids update this state (one state belongs to one pipeline).
    :param name: state name; the tables are ``txn_state_<name>`` and ``txn_stage_<name>``.
    :param kind: ``non_transactional``, ``transactional`` or ``opaque``.
    :param keys: key columns as ``{column: SQL type}`` (e.g. ``{"word": "text"}``).
    :param value_type: SQL type of the value: bigint (default), integer, numeric, double precision.
    :param combiner: how deltas combine: ``sum`` (default), ``max`` or ``min``.
    :param fillfactor: storage fill factor of the state table (10-100, default 50). Space left free
        on each page lets Postgres update a key in place (a HOT update, no new index entry), a
        faster apply at up to twice the table size (docs/benchmarks.md). A storage setting only:
        not part of the stored definition.
    """

    pipeline: str
    name: str
    kind: StateKind | str = StateKind.TRANSACTIONAL
    keys: Mapping[str, str] = field(default_factory=dict)
    value_type: str = "bigint"
    combiner: str = "sum"
    fillfactor: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StateKind(self.kind))
        _ident(self.name, "state name")
        check_table_names(self.name)
        check_columns(self.keys, self.value_type, self.combiner, self.fillfactor)
        object.__setattr__(self, "keys", dict(self.keys))

    @classmethod
    def load(cls, bind: Engine | Connection, name: str) -> MapState:
        """The state registered as ``name`` (by :meth:`create`), e.g. inside a Spark job."""
        states = _load(bind, named(name))
        if not states:
            raise StateDefinitionError(f"state {name!r} is not registered (create it first)")
        return states[0]

    # -- names -----------------------------------------------------------------------------------

    @property
    def rule(self) -> KindRule:
        """How this state's kind applies a batch (:mod:`~airflow_txn_provider.state.kinds`)."""
        return rule_for(self.kind)

    @property
    def backing(self) -> BackingTable:
        """This state's tables (:mod:`~airflow_txn_provider.state.backing`)."""
        return BackingTable(
            self.name, self.keys, self.value_type, self.combiner, self.rule, int(self.fillfactor)
        )

    @property
    def table(self) -> str:
        return self.backing.table

    @property
    def stage_table(self) -> str:
        return self.backing.stage_table

    @property
    def output_key(self) -> str:
        """Key of this state's staged row count in a txid's recorded output."""
        return f"staged:{self.name}"

    @property
    def derived_from(self) -> str | None:
        """Name of the state this one is computed from at commit time (``None``: staged by jobs)."""
        return None

    @property
    def quoted_keys(self) -> list[str]:
        """The key columns as quoted SQL identifiers (``singleton`` for a global state)."""
        return self.backing.quoted_keys

    def definition(self) -> dict[str, Any]:
        return {
            "kind": StateKind(self.kind).value,
            "keys": dict(self.keys),
            "value_type": self.value_type,
            "combiner": self.combiner,
        }

    # -- DDL -------------------------------------------------------------------------------------

    def create(
        self, bind: Engine | Connection, *, start: OutputStart | str | None = None
    ) -> MapState:
        """Create the state and staging tables if missing; refuse a contradicting definition.
        ``start``: how a state new to a pipeline that has begun txids starts (the registry)."""
        from sqlalchemy.engine import Engine

        if isinstance(bind, Engine):
            with bind.begin() as conn:
                self._create(conn, start)
        else:
            self._create(bind, start)
        return self

    def _create(self, conn: Connection, start: OutputStart | str | None) -> None:
        """Register, then the tables: one transaction, serialised with other processes' DDL."""
        lock_ddl(conn)
        kind, definition = StateKind(self.kind), self.definition()
        register_state(conn, self.name, self.pipeline, kind, definition, start)
        backing = self.backing
        existed = backing.exists(conn)
        backing.create_table(conn)
        if self.keys:
            start_summary(conn, self.name, fresh=not existed)
        backing.create_stage(conn)
        UndoRecords(backing).create(conn)
        create_as_of_function(conn, backing, self.pipeline)  # txn_as_of_<name>(txid)

    def summary(self, conn: Connection) -> tuple[int, Any] | None:
        """``(keys, sum of values)`` as the commits kept them, or ``None`` if no commit kept them
        yet (a state created by an earlier version, not committed to since). One row read."""
        return read_summary(conn, self.name)

    def top(self, conn: Connection, k: int) -> list[tuple[Any, ...]]:
        """The ``k`` keys with the largest values, ``(keys…, value)``, largest first (ties by
        key): one scan of the table with a top-``k`` sort (the Transactions page rate-limits it,
        see ``ui.reader.TOP_KEYS_REFRESH_S``)."""
        return top_keys(conn, self.backing, k)

    # -- processing phase: stage -----------------------------------------------------------------

    def _malformed(
        self, txid: int, attempt: int, problem: str, row: Any = None
    ) -> MalformedOutputError:
        shown = None if row is None else repr(row)
        return MalformedOutputError(
            f"state {self.name!r}: {problem}"
            + (f" in staged row {shown}" if shown else "")
            + "; nothing was staged",
            pipeline=self.pipeline,
            txid=txid,
            attempt=attempt,
            state=self.name,
            row=shown,
        )

    def _refused(self, txid: int, attempt: int, refused: Refused) -> MalformedOutputError:
        return self._malformed(txid, attempt, refused.problem, refused.row)

    def stage(
        self,
        conn: Connection,
        txid: int,
        attempt: int,
        rows: Iterable[Sequence[Any]],
        *,
        job: str = "",
    ) -> int:
        """Stage ``(keys…, delta)`` rows of ``(txid, attempt)`` with one binary COPY; return the
        count.

        Replaces rows the same ``job`` of this attempt staged before (a duplicate run stages once,
        not twice); rows of other jobs of the attempt are kept. A batch outside the value domain
        (:mod:`~airflow_txn_provider.state.staging`: a null key, NUL in a text key, a key over
        the size limit, a null, NaN, infinite or fractional-into-integer delta, a batch sum out
        of range) is refused whole with :class:`MalformedOutputError`; an empty string key is a
        key like any other.
        """
        try:
            checked = check_rows(self.keys, self.value_type, self.combiner, rows)
        except Refused as refused:
            raise self._refused(txid, attempt, refused) from None
        return self._copy(conn, txid, attempt, checked, job)

    def stage_arrow(
        self, conn: Connection, txid: int, attempt: int, table: pa.Table, *, job: str = ""
    ) -> int:
        """Stage an Arrow table (columns: the key columns, then ``delta``) with one binary COPY.

        What a Spark job stages: ``DataFrame.toArrow()`` of its partial results. Checked against
        the value domain as :meth:`stage` is, naming the first offending row, before anything
        is staged.
        """
        columns = [*self.keys, "delta"]
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(
                f"state {self.name!r} stages columns {columns}; the result has "
                f"{table.column_names} (missing {missing})"
            )
        try:
            rows = arrow_rows(self.keys, self.value_type, self.combiner, table.select(columns))
        except Refused as refused:
            raise self._refused(txid, attempt, refused) from None
        return self._copy(conn, txid, attempt, rows, job)

    def _copy(
        self,
        conn: Connection,
        txid: int,
        attempt: int,
        rows: pa.Table | list[tuple[Any, ...]],
        job: str,
    ) -> int:
        try:
            return self.backing.copy(conn, txid, attempt, rows, job)
        except psycopg.errors.DataError as err:  # the domain checks should leave none: a net
            raise self._malformed(txid, attempt, f"COPY refused the rows: {err}") from err
        except psycopg.errors.IntegrityConstraintViolation as err:
            raise self._malformed(txid, attempt, f"COPY refused the rows: {err}") from err

    def staged_count(self, conn: Connection, txid: int, attempt: int) -> int:
        """How many rows ``(txid, attempt)`` staged, every job's."""
        return self.backing.staged_count(conn, txid, attempt)

    def staged(self, conn: Connection, txid: int, attempt: int) -> list[tuple[Any, ...]]:
        """The rows ``(keys…, delta)`` staged by ``(txid, attempt)``, sorted (for inspection)."""
        return self.backing.staged(conn, txid, attempt)

    # -- commit phase: apply ---------------------------------------------------------------------

    def apply(
        self, conn: Connection, txid: int, attempt: int, *, expected_rows: int | None = None
    ) -> ApplyResult:
        """Fold ``(txid, attempt)``'s staged rows (of every job) into the state: one statement.

        Also drops staged rows of this txid and older ones (every attempt). Run it inside the
        commit's database transaction (see :mod:`airflow_txn_provider.transactions.commit`).
        """
        backing = self.backing
        summary_cte, summarised = summary_upkeep_cte(bool(self.keys))
        try:
            row = backing.apply(conn, txid, attempt, summary_cte=summary_cte, summarised=summarised)
        except DataError as err:
            if sqlstate(err) != NUMERIC_OUT_OF_RANGE:
                raise
            raise self._out_of_range(conn, txid, attempt) from err
        if expected_rows is not None and int(row.staged) != expected_rows:
            raise StagedOutputMismatchError(
                f"state {self.name!r}: {row.staged} staged rows found, the attempt recorded "
                f"{expected_rows} (staging lost, e.g. after a Postgres crash); replay the txid",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        if int(row.written) != int(row.keys):
            newest = backing.newest_txid(conn)
            raise StateAheadOfLogError(
                f"state {self.name!r} holds {int(row.keys) - int(row.written)} key(s) updated by "
                f"a later txid (newest stored txid {newest}); state and transaction log disagree",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        if not row.summarised:  # no summary yet (a state of an earlier version): count once
            count_summary_once(conn, self.name, backing, txid)
        return ApplyResult(staged_rows=int(row.staged), keys=int(row.keys))

    # -- rewind ----------------------------------------------------------------------------------

    def rewind(self, conn: Connection, to_txid: int) -> dict[str, int]:
        """Put the state back as it was after ``to_txid - 1``'s commit (from the undo records the
        commits of ``to_txid`` and later wrote), and count its summary again. Run it inside the
        rewind's database transaction (:mod:`airflow_txn_provider.transactions.rewind`), under the
        pipeline's lock. Returns ``{"restored": keys, "removed": keys}``."""
        restored, removed = UndoRecords(self.backing).rewind(conn, to_txid)
        if self.keys:
            count_summary_once(conn, self.name, self.backing, to_txid - 1)  # an upsert
        return {"restored": restored, "removed": removed}

    def _out_of_range(self, conn: Connection, txid: int, attempt: int) -> TxnError:
        """The typed error of a commit whose sum leaves the value type's range, naming a key
        (found in the error path only: one aggregate over the batch and its stored values)."""
        key, total = self.backing.out_of_range(conn, txid, attempt)
        return StateValueOutOfRangeError(
            f"state {self.name!r}: the commit takes key {key} to {total}, out of "
            f"{self.value_type}'s range",
            pipeline=self.pipeline,
            txid=txid,
            attempt=attempt,
            state=self.name,
            key=key,
        )

    # -- reading ---------------------------------------------------------------------------------

    def items(self, conn: Connection) -> dict[tuple[Any, ...], Any]:
        """The whole map: ``{(key values…): value}``."""
        return self.backing.items(conn)

    def rows(self, conn: Connection) -> list[dict[str, Any]]:
        """Every stored row with its bookkeeping columns (txid, prev_value), for inspection."""
        return self.backing.rows(conn)

    def get(self, conn: Connection, keys: Sequence[Sequence[Any]]) -> dict[tuple[Any, ...], Any]:
        """Values of ``keys`` (missing keys are absent from the result), in one query."""
        return self.backing.get(conn, keys)


class GlobalState(MapState, GlobalAsOfReads):
    """A single value (Trident's Snapshottable; Storm's TransactionalGlobalCount)."""

    def __init__(
        self,
        pipeline: str,
        name: str,
        kind: StateKind | str = StateKind.TRANSACTIONAL,
        value_type: str = "bigint",
        combiner: str = "sum",
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            name=name,
            kind=kind,
            keys={},
            value_type=value_type,
            combiner=combiner,
            fillfactor=100,
        )

    def stage_value(
        self, conn: Connection, txid: int, attempt: int, delta: Any, *, job: str = ""
    ) -> int:
        return self.stage(conn, txid, attempt, [(delta,)], job=job)

    def value(self, conn: Connection) -> Any:
        return self.backing.value(conn)


@dataclass(frozen=True, eq=False, init=False)  # fields for `of` and `bucket_size`, its own __init__
class BucketCountState(MapState):
    """How many keys of another state have a value in each bucket ``value // bucket_size``.

    Storm's TransactionalWords keeps word counts and, in the same transaction, how many words
    fall in each count bucket (0-9, 10-19, …). A word moving from bucket 0 to bucket 1 takes one
    from bucket 0 and adds one to bucket 1, which needs its committed count before the batch:
    :meth:`derive` computes those moves inside the commit, from the source state's staged deltas
    and committed values, and stages them as this state's batch. Key column: ``bucket``.

    :param of: the state whose keys are counted; a keyed state with the ``sum`` combiner, of the
        same pipeline.
    :param bucket_size: width of a bucket (values 0..bucket_size-1 are bucket 0).
    """

    of: str = ""
    bucket_size: int = 10

    def __init__(
        self,
        pipeline: str,
        name: str,
        of: str,
        bucket_size: int = 10,
        kind: StateKind | str = StateKind.TRANSACTIONAL,
    ) -> None:
        _ident(of, "source state name")
        if of == name:
            raise ValueError(f"state {name!r} cannot count its own buckets")
        if int(bucket_size) < 1:
            raise ValueError(f"bucket_size must be >= 1, got {bucket_size!r}")
        # Its own fields first: the base class's checks run in __post_init__.
        object.__setattr__(self, "of", of)
        object.__setattr__(self, "bucket_size", int(bucket_size))
        super().__init__(pipeline=pipeline, name=name, kind=kind, keys={"bucket": "bigint"})

    @property
    def derived_from(self) -> str | None:
        return self.of

    def definition(self) -> dict[str, Any]:
        derived = {"bucket_counts_of": self.of, "bucket_size": self.bucket_size}
        return {**super().definition(), **derived}

    def derive(self, conn: Connection, txid: int, attempt: int, source: MapState) -> int:
        """Stage this txid's bucket moves, computed from ``source`` before it applies the txid.

        Must run in the commit's database transaction and before ``source.apply``: the log
        commits a txid once, so the committed values read here are those before this txid.
        """
        if (
            source.name != self.of
            or not source.keys
            or source.combiner != "sum"
            or source.derived_from is not None  # its stage rows are written at commit time too
        ):
            raise StateDefinitionError(
                f"bucket state {self.name!r} counts state {self.of!r}, which must be a keyed "
                f"state with the sum combiner, not itself derived (got {source.name!r}: keys "
                f"{list(source.keys)}, "
                f"combiner {source.combiner!r})",
                pipeline=self.pipeline,
                txid=txid,
                attempt=attempt,
            )
        return self.backing.stage_bucket_moves(
            conn, txid, attempt, source.backing, self.bucket_size
        )


def load_states(bind: Engine | Connection, pipeline: str) -> dict[str, MapState]:
    """Every state registered for ``pipeline``, by name."""
    return {state.name: state for state in _load(bind, of_pipeline(pipeline))}


def counted_states(bind: Engine | Connection, pipeline: str) -> dict[str, MapState]:
    """The states of ``pipeline`` a processed txid's output holds a row count for, by output key:
    every one but a derived state (the commit writes its rows). Each gets a count, zero included,
    so the commit checks every one."""
    states = load_states(bind, pipeline).values()
    return {s.output_key: s for s in states if s.derived_from is None}


def _load(bind: Engine | Connection, where: ColumnElement[bool]) -> list[MapState]:
    return [_from_definition(*row) for row in registered(bind, where)]


def _from_definition(pipeline: str, name: str, d: Mapping[str, Any]) -> MapState:
    """The state a registry row declares (the inverse of :meth:`MapState.definition`)."""
    if "bucket_counts_of" in d:
        return BucketCountState(pipeline, name, d["bucket_counts_of"], d["bucket_size"], d["kind"])
    if d["keys"]:
        return MapState(pipeline, name, d["kind"], d["keys"], d["value_type"], d["combiner"])
    return GlobalState(pipeline, name, d["kind"], d["value_type"], d["combiner"])
