"""SQLAlchemy 2 models of the transaction log, for queries (``migrations/`` owns the schema).

* ``txn_pipeline``: one row per pipeline; its row lock serialises the pipeline's transitions, so
  "one commit at a time" holds in Postgres, not only in Airflow. Retention: the newest
  ``keep_txids`` committed txids keep their rows; commits delete older ones in bounded batches
  and count them in ``pruned_*``.
* ``txn_transaction``: a txid's current attempt, status and batch; ``txn_attempt``: every attempt.
* ``txn_state_registry``: which pipeline owns which state; ``txn_pipeline_dag``: which DAGs run
  which pipeline; ``txn_rewind`` and ``txn_alert``: one row per rewind, per alert sent.
* ``txn_output``: each output's completeness and retirement; ``txn_map_summary``: each map
  state's key count and value sum, kept by each commit.
* ``txn_source_partition``, ``txn_source_file`` and ``txn_source_names``: what file sources'
  discovery found.
* ``txn_quarantine``: rows a ``drop`` expectation took out of a txid's output;
  ``txn_quarantine_staging``: those a Spark job took out, until the attempt commits.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    TypeDecorator,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.rules.config import DEFAULT_KEEP_TXIDS
from airflow_txn_provider.rules.exceptions import CorruptLogError
from airflow_txn_provider.rules.vocabulary import (
    FailureResponse,
    OutputKind,
    OutputRetirement,
    OutputStart,
    SourceKind,
    StateKind,
    TxStatus,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class StrEnumText(TypeDecorator[StrEnum]):
    """A ``str`` enum of the vocabulary stored as its value in a ``VARCHAR(20)``: queries bind and
    read the enum, never a retyped literal.

    Not SQLAlchemy's ``Enum``: a value the enum does not know (a CHECK constraint keeps them out,
    so only a damaged log holds one) must be a :class:`CorruptLogError`, not a ``LookupError``.
    """

    impl = String(20)
    cache_ok = True

    def __init__(self, enum_class: type[StrEnum], what: str) -> None:
        super().__init__()
        self.enum_class = enum_class
        self.what = what

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else self.enum_class(value).value

    def process_result_value(self, value: Any, dialect: Dialect) -> StrEnum | None:
        if value is None:
            return None
        try:
            return self.enum_class(value)
        except ValueError:
            raise CorruptLogError(f"unknown {self.what} {value!r}") from None


def one_of(column: str, enum_class: type[StrEnum]) -> str:
    """A CHECK constraint's text allowing exactly the enum's values."""
    return f"{column} IN ({', '.join(repr(m.value) for m in enum_class)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class PipelineRow(Base):
    __tablename__ = "txn_pipeline"

    name: Mapped[str] = mapped_column(String(250), primary_key=True)
    source_kind: Mapped[SourceKind] = mapped_column(StrEnumText(SourceKind, "source kind"))
    max_pending: Mapped[int] = mapped_column(Integer)
    last_committed_txid: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    declaration: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Fingerprint of the declaration last registered (see ``TransactionLog.ensure_pipeline``)."""
    keep_txids: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_KEEP_TXIDS, server_default=str(DEFAULT_KEEP_TXIDS)
    )
    """Retention: how many of the newest committed txids keep their rows (see migration 0007)."""
    pruned_txids: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Txids whose rows retention deleted (all committed), and their attempts, failed ones too."""
    pruned_attempts: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    pruned_failed_attempts: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    pruned_through_txid: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Every txid up to this one was pruned."""
    undo_from_txid: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")
    """The first txid whose commit wrote undo records: a rewind reaches no further back (see
    migration 0009)."""
    run_trouble: Mapped[str | None] = mapped_column(Text, nullable=True)
    """What the pipeline's waker could not mend in Airflow, and since when (migration 0013)."""
    run_trouble_since: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    runs_made_through: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """The newest txid whose DAG run a claim made ahead of its begin: a hint (migration 0014)."""

    __table_args__ = (
        CheckConstraint(one_of("source_kind", SourceKind), name="source_kind"),
        CheckConstraint("max_pending >= 1", name="max_pending"),
        CheckConstraint("last_committed_txid >= 0", name="last_committed_txid"),
        CheckConstraint("keep_txids >= 1", name="keep_txids"),
    )


class PipelineDagRow(Base):
    """Which Airflow DAG runs a pipeline (recorded by its begin task): what the Transactions page
    authorises a pipeline by."""

    __tablename__ = "txn_pipeline_dag"

    pipeline: Mapped[str] = mapped_column(String(250), primary_key=True)
    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    recorded_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
    )


class TransactionRow(Base):
    __tablename__ = "txn_transaction"

    pipeline: Mapped[str] = mapped_column(String(250), primary_key=True)
    txid: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[TxStatus] = mapped_column(StrEnumText(TxStatus, "status"))
    batch_metadata: Mapped[Any] = mapped_column("metadata", JSONB, nullable=True)
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """Reference to the current attempt's processed output (e.g. staged row counts per state)."""
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    failed_by: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """While the current attempt is failed: the txid whose failure failed it (itself if its own)."""
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    """While processing: the attempt's process renews this while alive (see migration 0003)."""
    lease_holder: Mapped[str | None] = mapped_column(Text, nullable=True)
    begun_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
        CheckConstraint("txid >= 1", name="txid"),
        CheckConstraint("attempt >= 1", name="attempt"),
        CheckConstraint(one_of("status", TxStatus), name="status"),
    )


class AttemptRow(Base):
    __tablename__ = "txn_attempt"

    pipeline: Mapped[str] = mapped_column(String(250), primary_key=True)
    txid: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[TxStatus] = mapped_column(StrEnumText(TxStatus, "status"))
    batch_metadata: Mapped[Any] = mapped_column("metadata", JSONB, nullable=True)
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    failed_by: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    timings: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """Seconds spent per phase (``spark``, ``staging``, ``commit``, ...), as reported."""
    staged: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """``{job: {output key: rows}}``: what each job of the attempt staged, recorded in the same
    database transaction as its COPY (see migration 0008)."""
    response: Mapped[FailureResponse | None] = mapped_column(
        StrEnumText(FailureResponse, "failure response"), nullable=True
    )
    """Once failed: what the failure sensor did about it (see migration 0006)."""
    expectations: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """Each expectation's outcome for the attempt, as its commit judged it (migration 0016)."""

    __table_args__ = (
        ForeignKeyConstraint(
            ["pipeline", "txid"],
            ["txn_transaction.pipeline", "txn_transaction.txid"],
            ondelete="CASCADE",
        ),
        CheckConstraint(one_of("status", TxStatus), name="status"),
        CheckConstraint(one_of("response", FailureResponse), name="response"),
    )


class StateRegistryRow(Base):
    __tablename__ = "txn_state_registry"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(250))
    kind: Mapped[StateKind] = mapped_column(StrEnumText(StateKind, "state kind"))
    definition: Mapped[Any] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (CheckConstraint(one_of("kind", StateKind), name="kind"),)


class OutputRow(Base):
    """One output of a pipeline, a state or a lake sink (:mod:`airflow_txn_provider.log.outputs`):
    from which txid it is complete, and whether it was retired (migration 0011)."""

    __tablename__ = "txn_output"

    pipeline: Mapped[str] = mapped_column(String(250), primary_key=True)
    name: Mapped[str] = mapped_column(String(250), primary_key=True)
    kind: Mapped[OutputKind] = mapped_column(StrEnumText(OutputKind, "output kind"))
    start: Mapped[OutputStart | None] = mapped_column(
        StrEnumText(OutputStart, "output start"), nullable=True
    )
    """The declaration's choice; ``None``: declared before the pipeline began any txid."""
    complete_from_txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """It holds every committed txid from this one on and none before (``None``: not recorded,
    an output declared by an earlier version once the pipeline had begun txids)."""
    declared_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    retired_after_txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """Once retired: the last committed txid then, the newest it holds."""
    retirement: Mapped[OutputRetirement | None] = mapped_column(
        StrEnumText(OutputRetirement, "output retirement"), nullable=True
    )
    # Filled from history (migration 0012, :mod:`airflow_txn_provider.filling`)
    live_from_txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The first txid begun after the declaration: the live processing stages it from there."""
    filled_through: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The newest txid the fill applied, in txid order (0: none yet)."""
    fill_attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """The fill's fencing token: each fill process that takes over raises it."""
    joined_after_txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The last committed txid when the fill joined the live commits (``NULL``: filling)."""

    __table_args__ = (
        CheckConstraint(one_of("kind", OutputKind), name="kind"),
        CheckConstraint(one_of("start", OutputStart), name="start"),
        CheckConstraint(one_of("retirement", OutputRetirement), name="retirement"),
        CheckConstraint("complete_from_txid >= 1", name="complete_from_txid"),
    )


class RewindRow(Base):
    """One rewind of a pipeline (:mod:`airflow_txn_provider.transactions.rewind`): its txids from
    ``to_txid`` on were rolled back and re-queued."""

    __tablename__ = "txn_rewind"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(250))
    to_txid: Mapped[int] = mapped_column(BigInteger)
    last_committed_txid: Mapped[int] = mapped_column(BigInteger)
    """The last committed txid before the rewind."""
    rewound_txids: Mapped[int] = mapped_column(BigInteger)
    """How many txids became pending again (committed ones and those in flight)."""
    by: Mapped[str] = mapped_column(Text)
    """Who rewound: a user of the UI or the API, or ``cli:<os user>``."""
    job_version: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    states: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """Per state: ``{"restored": keys, "removed": keys}``."""
    rewound_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
        CheckConstraint("to_txid >= 1", name="to_txid"),
    )


class AlertRow(Base):
    """An alert the pipeline's notifiers were sent (:mod:`airflow_txn_provider.log.alerts`): once
    per ``(pipeline, kind, key)``."""

    __tablename__ = "txn_alert"

    pipeline: Mapped[str] = mapped_column(String(250), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    message: Mapped[str] = mapped_column(Text)
    sent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
    )


class MapSummaryRow(Base):
    """A map state's key count and value sum, updated by each commit with the deltas it applied
    (:meth:`~airflow_txn_provider.state.MapState.apply`), in the commit's transaction."""

    __tablename__ = "txn_map_summary"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    keys: Mapped[int] = mapped_column(BigInteger)
    total: Mapped[Any] = mapped_column(Numeric)
    txid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The txid whose commit updated it last."""
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        ForeignKeyConstraint(["name"], ["txn_state_registry.name"], ondelete="CASCADE"),
    )


class SourcePartitionRow(Base):
    """A file source's partition as its discovery last saw it
    (:mod:`airflow_txn_provider.sources.catalog`): shared by every host's begins and jobs."""

    __tablename__ = "txn_source_partition"

    source: Mapped[str] = mapped_column(Text, primary_key=True)
    """The dataset's key (e.g. ``parquet:<path>:<offset column>``)."""
    partition: Mapped[str] = mapped_column(Text, primary_key=True)
    folders: Mapped[Any] = mapped_column(JSONB)
    """Each folder of the partition -> ``[inode, mtime_ns, listed_at_ns]`` at its last listing."""
    end_offset: Mapped[int] = mapped_column(BigInteger)
    newest: Mapped[Any] = mapped_column(JSONB)
    """The files holding ``end_offset - 1`` -> ``[size, mtime_ns]``."""


class SourceFileRow(Base):
    """A file a source's discovery looked at: its offset range, read once from its footer."""

    __tablename__ = "txn_source_file"

    source: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """Relative to the partition's folder."""
    size: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    first_offset: Mapped[int] = mapped_column(BigInteger)
    last_offset: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_txn_source_file_last", "source", "partition", "last_offset"),)


class SourceNamesRow(Base):
    """Some of a partition's file names (those of ``txn_source_file``), newline-separated: what a
    listing compares a folder with, read as a few values where there is a row per file."""

    __tablename__ = "txn_source_names"

    source: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[str] = mapped_column(Text, primary_key=True)
    segment: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    names: Mapped[str] = mapped_column(Text)


class _Quarantined:
    """A row a ``drop`` expectation took out of a txid's output, stamped with the attempt and the
    expectations it failed (the row as JSON)."""

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(250))
    output: Mapped[str] = mapped_column(String(250))
    txid: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer)
    expectations: Mapped[list[str]] = mapped_column(ARRAY(Text))
    row: Mapped[Any] = mapped_column(JSONB)


class QuarantineRow(_Quarantined, Base):
    """Quarantined (:mod:`airflow_txn_provider.transactions.audit`): kept until a person deletes
    it, or a rewind takes its txid back."""

    __tablename__ = "txn_quarantine"

    quarantined_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
        Index("ix_txn_quarantine_txid", "pipeline", "txid"),  # a txid's rows; a rewind's
    )


class QuarantineStagingRow(_Quarantined, Base):
    """Taken out by a Spark job (of its input batch or a lake sink's rows), staged with the
    attempt's output: the attempt's commit moves it to ``txn_quarantine``."""

    __tablename__ = "txn_quarantine_staging"

    __table_args__ = (
        ForeignKeyConstraint(["pipeline"], ["txn_pipeline.name"], ondelete="CASCADE"),
        Index("ix_txn_quarantine_staging_txid", "pipeline", "txid", "attempt"),
    )


# The tables, for SQLAlchemy Core statements (the log and the states write with Core: explicit
# locking and RETURNING, no unit of work between a rule's answer and the rows).
PIPELINES = cast(Table, PipelineRow.__table__)
PIPELINE_DAGS = cast(Table, PipelineDagRow.__table__)
TRANSACTIONS = cast(Table, TransactionRow.__table__)
ATTEMPTS = cast(Table, AttemptRow.__table__)
STATE_REGISTRY = cast(Table, StateRegistryRow.__table__)
MAP_SUMMARY = cast(Table, MapSummaryRow.__table__)
REWINDS = cast(Table, RewindRow.__table__)
ALERTS = cast(Table, AlertRow.__table__)
OUTPUTS = cast(Table, OutputRow.__table__)
SOURCE_PARTITIONS = cast(Table, SourcePartitionRow.__table__)
SOURCE_FILES = cast(Table, SourceFileRow.__table__)
QUARANTINE = cast(Table, QuarantineRow.__table__)
QUARANTINE_STAGING = cast(Table, QuarantineStagingRow.__table__)
