"""Every domain error of the provider, in one place.

Each error names the pipeline, txid and attempt it is about (``None`` where it does not apply), so a
log line or an Airflow task failure always says *which* transaction went wrong.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TxnError(Exception):
    """Base class: an error about one pipeline and, where known, one txid and attempt.

    A subclass that says more (where a bad record is, which state) names those keyword arguments
    in ``fields``: they become attributes (``None`` when not given) and survive pickling.
    """

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        message: str,
        *,
        pipeline: str | None = None,
        txid: int | None = None,
        attempt: int | None = None,
        **fields: str | None,
    ) -> None:
        unknown = sorted(set(fields) - set(self.fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no argument(s) {unknown}")
        for name in self.fields:
            setattr(self, name, fields.get(name))
        self.pipeline = pipeline
        self.txid = txid
        self.attempt = attempt
        self.detail = message
        about_nothing = pipeline is None and txid is None and attempt is None  # a config error
        where = "" if about_nothing else f"pipeline={pipeline} txid={txid} attempt={attempt}: "
        super().__init__(where + message)

    def __reduce__(self):  # keep the keyword arguments across pickling (multiprocessing, Airflow)
        fields = {name: getattr(self, name) for name in self.fields}
        return (_rebuild, (type(self), self.detail, self.pipeline, self.txid, self.attempt, fields))

    def naming(self, pipeline: str, txid: int, attempt: int | None = None) -> TxnError:
        """This error, of the same type and fields, naming the pipeline, txid and attempt it was
        raised for (a source knows no pipeline: its errors name none until the caller's do)."""
        fields = {name: getattr(self, name) for name in self.fields}
        return type(self)(self.detail, pipeline=pipeline, txid=txid, attempt=attempt, **fields)


def _rebuild(cls, message, pipeline, txid, attempt, fields=None):
    return cls(message, pipeline=pipeline, txid=txid, attempt=attempt, **(fields or {}))


class UnknownPipelineError(TxnError):
    """The pipeline was never registered in the transaction log."""


class PipelineConfigError(TxnError):
    """A pipeline is re-registered with a definition that contradicts the stored one."""


class OutputDeclarationError(PipelineConfigError):
    """A state or lake sink is added to, or removed from, a pipeline in a way that would leave an
    output silently partial or decide its tables' fate unasked; ``output`` names it (or them) and
    the message what to choose. Nothing was changed."""

    fields = ("output",)
    output: str | None


class OutputStartRequiredError(OutputDeclarationError):
    """An output is added to a pipeline that has begun txids without saying how it starts
    (``start={name: "next_txid"}``): it would hold only the txids after it, short of all before."""


class OutputRemovedError(OutputDeclarationError):
    """An output that holds committed txids is no longer declared and ``retired={name: …}``
    does not say whether its tables are kept or dropped."""


class FillRefusedError(OutputDeclarationError):
    """An output cannot be filled from history (``start={name: "history"}``): the source may read
    other records on a replay (an opaque source), or retention pruned the txids it would need.
    The message names why, and how far back history could be filled. Nothing was changed."""


class FillError(TxnError):
    """Filling an output from history (:mod:`airflow_txn_provider.transactions.fill`) met what
    it cannot go past, e.g. a job that does not compute the output. ``output`` names it; the
    fill resumes from its recorded progress once the cause is gone."""

    fields = ("output",)
    output: str | None


class NotBegunError(TxnError):
    """An operation names a txid that was never begun."""


class OutOfOrderCommitError(TxnError):
    """A commit of txid k was asked for before txid k-1 committed."""


class StaleAttemptError(TxnError):
    """The attempt is no longer the current one of its txid (it was failed or re-emitted)."""


class NotProcessedError(TxnError):
    """A commit was asked for an attempt whose processed output was never recorded."""


class ConflictingOutputError(TxnError):
    """The same attempt reported two different processed outputs."""


class StagedOutputMismatchError(TxnError):
    """At commit, the staged rows are not the ones the attempt recorded as its output.

    Staging tables are UNLOGGED (fast, but emptied by a Postgres crash); the count check turns
    such a loss into this error, which fails and replays the txid instead of committing nothing.
    """


class UnreadableMetadataError(TxnError):
    """Batch metadata cannot be stored and read back unchanged as JSON (cf. STORM-2675)."""


class CorruptLogError(TxnError):
    """A row of the transaction log breaks the log's invariants; nothing is repaired silently."""


class SchemaTooOldError(TxnError):
    """The transaction-log schema in Postgres is older than this library and was not migrated."""


class SchemaTooNewError(TxnError):
    """The transaction-log schema in Postgres is at a revision this library does not know: a newer
    version of the library migrated it. Neither migrating nor running on it is safe; the advice is
    to upgrade the library on this machine, never to downgrade the database."""


class StateAheadOfLogError(TxnError):
    """A state row carries a txid newer than the one being committed (Trident's OpaqueMap rule)."""


class StateDefinitionError(TxnError):
    """A state is declared with a definition that contradicts the one stored in Postgres."""


class SourceError(TxnError):
    """The source failed to describe a batch (a partition is missing, the store is unreachable)."""


class ProcessingError(TxnError):
    """A txid's processing job failed (a Spark error, a bug in the transform); see the cause."""


class ProcessingStoppedError(ProcessingError):
    """This process's run of an attempt was stopped (Airflow killed its task, or its lease was
    lost): it ends without reporting a failure; whoever stopped it decides about the attempt."""


class MalformedRecordError(SourceError):
    """A record of the batch cannot be read (bad JSON, wrong type, a required value missing).

    ``location`` says where it is (a file path, a table and id) so it can be fixed at the source;
    the txid commits nothing until it is.
    """

    fields = ("location",)
    location: str | None

    def __init__(
        self,
        message: str,
        *,
        pipeline: str | None = None,
        txid: int | None = None,
        attempt: int | None = None,
        location: str | None = None,
    ) -> None:
        where = f" at {location}" if location else ""
        super().__init__(
            f"{message}{where}", pipeline=pipeline, txid=txid, attempt=attempt, location=location
        )
        self.detail = message


class LeaseExpiredError(TxnError):
    """A processing attempt stopped renewing its lease: its process is gone (killed, out of
    memory, a lost worker). The attempt is failed and the txid replays with a new attempt."""


class RequeueError(TxnError):
    """The failure sensor could not restart a txid's run through the Airflow REST API."""


class MalformedEventError(TxnError):
    """A task resumed with a trigger event this provider's trigger does not fire (an unknown
    state, a txid or attempt missing or not an integer): refused rather than guessed at."""


class PoisonBatchError(TxnError):
    """A txid failed on its own ``max_attempts`` times: the pipeline stops at it until a person
    fixes the cause and reruns it (Clear in the Airflow UI)."""


class ExpectationsFailedError(TxnError):
    """A txid's audit before its commit stopped it (:mod:`airflow_txn_provider.rules.
    expectations`): a ``fail`` expectation failed, or an expectation could not be checked. A
    poison batch at once: a replay would stage the same rows. ``outcomes``: every expectation's,
    as the log records them (not kept across pickling)."""

    def __init__(self, message: str, *, outcomes: list[dict] | None = None, **named: Any) -> None:
        super().__init__(message, **named)
        self.outcomes = outcomes or []


class InjectedFailure(ProcessingError):
    """A failure asked for by the failure-injection switch (a demo and test aid)."""


class TxnConfigError(TxnError):
    """The provider's configuration (an Airflow connection, a setting) is missing or unreadable."""


class InvalidNameError(TxnConfigError, ValueError):
    """A name that would reach SQL, a file path or a lake predicate breaks its rule
    (:mod:`airflow_txn_provider.rules.names`). A ``ValueError`` too: it is bad configuration."""


class MalformedOutputError(TxnError):
    """A processing job's partial result cannot be staged: a null key, a null, NaN or infinite
    delta, a value of the wrong type. Refused before anything is staged, so it can never turn a
    committed value into NULL or NaN; ``state`` and ``row`` say which state and which row."""

    fields = ("state", "row")
    state: str | None
    row: str | None


class StateValueOutOfRangeError(TxnError):
    """A commit would take a state's value out of its type's range (a bigint sum past 2**63 - 1):
    permanent, so the txid fails at once; ``state`` and ``key`` say where."""

    fields = ("state", "key")
    state: str | None
    key: str | None


class IncompleteBatchError(SourceError):
    """A batch read fewer records than its metadata describes (a partition directory that does
    not match its metadata, files gone): committing it would silently lose records."""


class OffsetsWentBackError(SourceError):
    """A source reports a partition's newest offset below where the previous batch ended (the
    partition was rewritten or renumbered). Clamping would stall, then skip records."""


class OffsetsDeletedError(SourceError):
    """Records a transactional source must read are gone: a Kafka topic's retention deleted them
    (its earliest offset is past where the batch starts) before any txid read them. Skipping them
    would lose records; an opaque source skips them instead, and says so."""

    fields = ("partition",)


class SourceLogChangedError(SourceError):
    """The log a txid's offsets belong to is not the one the log recorded: the topic was created
    again (another topic id), the partition was truncated (its leader epoch no longer reaches
    the offset), or another record sits at a recorded offset (the broker lost its data and the
    log was written again). Reading on would read around the lost records, or read other records
    for a transactional replay; refused until an operator rewinds or declares a reset
    (``reset_log_from_txid``). ``partition``, ``recorded`` and ``current`` say where and what."""

    fields = ("partition", "recorded", "current")


class OffsetGapError(SourceError):
    """A source's files, named by their first offset, skip or repeat offsets: the file named
    for the next offset is missing while a later one is there, or a file's first offset is not
    the one its name says. Crossing the gap would lose (or repeat) records."""

    fields = ("partition", "file")


class RewindError(TxnError):
    """A rewind (:meth:`~airflow_txn_provider.transactions.transaction_log.TransactionLog.rewind`)
    cannot be done as asked; nothing was changed."""


class RewindTooFarError(RewindError):
    """The txid to rewind to is below what the log can restore exactly: retention pruned the
    undo records (or the txid before it), or the txids were committed by a version that wrote
    none. ``floor`` says how far back a rewind can go."""

    fields = ("floor",)


class RewindAheadError(RewindError):
    """The txid to rewind to was never committed nor begun: nothing from it on can be recomputed
    (a rewind goes back to a committed txid, or to the oldest uncommitted one)."""


class LakeSinkError(TxnError):
    """A lake sink (Delta Lake, Apache Iceberg) cannot stage or commit a txid's output."""


class LakeSchemaMismatchError(LakeSinkError):
    """The batch's columns do not match the lake table's schema (a missing, extra or retyped
    column). Refused before the table commit, so the table never holds a mixed schema."""


class LakeTableOutOfSyncError(LakeSinkError):
    """The lake table holds a later txid of this pipeline than the one being committed: it was
    written by another transaction log, or the log was reset."""


class TxidNotReadableError(LakeSinkError):
    """A read "as of txid N" names a txid the table never held (N below its first commit)."""


class StateTxidNotReadableError(TxnError):
    """A read of a Postgres state *as of txid N* (or of what txid N changed) that the log cannot
    answer exactly: N is older than the undo records retention keeps (or than the version that
    first wrote them), or N was never committed. ``txid`` is the txid asked, ``state`` the
    state, ``floor`` the oldest txid it can be read as of, ``last_committed`` the newest."""

    fields = ("state", "floor", "last_committed")
    state: str | None
    floor: str | None
    last_committed: str | None
