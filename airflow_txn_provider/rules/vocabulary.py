"""The vocabulary: the enums every room of the provider speaks.

A txid's status, a source's and a state's kind, the failure sensor's answer, what a trigger's
event says, and what each rule may answer (:mod:`airflow_txn_provider.rules.coordinator`,
:mod:`airflow_txn_provider.rules.fencing`). They live apart from the rules so the log's columns
(:mod:`airflow_txn_provider.log.models`), the states, the sources and the Airflow side can name them
without importing any rule. Each is a ``str`` enum: stored and shown as its value.
"""

from __future__ import annotations

from airflow_txn_provider.compat.python import StrEnum

# -- what the log records ----------------------------------------------------------------------


class TxStatus(StrEnum):
    """Status of a txid's *current* attempt."""

    PROCESSING = "processing"
    """Emitted: metadata initialised, processing in flight."""
    PROCESSED = "processed"
    """The current attempt's processed output is recorded; it waits for its turn to commit."""
    COMMITTED = "committed"
    """Final. The txid is never processed or committed again."""
    FAILED = "failed"
    """The current attempt is dead; the txid waits to be re-emitted with a new attempt."""


class SourceKind(StrEnum):
    """How a source replays a txid (Storm's transactional vs opaque spouts)."""

    TRANSACTIONAL = "transactional"
    """A txid's batch never changes: its metadata is stored at first emission and reused."""
    OPAQUE = "opaque"
    """A replay may differ: its metadata is recomputed from where the previous txid ended."""


class StateKind(StrEnum):
    """How a state applies a replayed txid (Trident's map states; the rules are in
    :mod:`airflow_txn_provider.state.kinds`)."""

    NON_TRANSACTIONAL = "non_transactional"
    """Adds every batch it is given: exactly once only with the log's commit in one transaction."""
    TRANSACTIONAL = "transactional"
    """Stores the txid with the value and skips a txid it applied: for transactional sources."""
    OPAQUE = "opaque"
    """Stores the value before the txid too, and re-applies a replay over it: for any source."""


class OutputKind(StrEnum):
    """What a pipeline's output is (``txn_output``, :mod:`airflow_txn_provider.log.outputs`)."""

    STATE = "state"
    """A Postgres state (:mod:`airflow_txn_provider.state`)."""
    LAKE_SINK = "lake_sink"
    """A lake table (:mod:`airflow_txn_provider.sinks`)."""


class OutputStart(StrEnum):
    """How an output added to a pipeline that has begun txids starts: the declaration's choice
    (``TxnPipeline(start={name: …})``). Without one such a declaration is refused: the output
    would silently hold only the txids after it. The log records from which txid it is
    complete."""

    NEXT_TXID = "next_txid"
    """Knowingly partial: it holds the txids from the next one to begin on, none before
    (recorded and shown as "complete from txid N")."""
    HISTORY = "history"
    """Filled from history: its own jobs compute it over every committed txid's batch, in txid
    order, beside the live pipeline, which it joins at a txid boundary; complete from txid 1
    once joined (:mod:`airflow_txn_provider.rules.filling`). Transactional sources only."""


class OutputRetirement(StrEnum):
    """What becomes of an output's tables when the declaration drops it (``retired={name: …}``).
    Without a choice, removing an output that holds committed txids is refused."""

    KEEP = "keep"
    """Its tables stay as they are, no longer updated (shown as retired after txid R); its name
    cannot be declared again while they do."""
    DROP = "drop"
    """Its Postgres tables are dropped (a lake table is never dropped by the provider)."""


LAKE_OUTPUT_PREFIX = "lake:"
"""Keys of a txid's recorded output that a lake sink wrote (``lake:<sink>``: its table's version
and the files it staged), read by the commit and by the rewind."""

AUDIT_OUTPUT_PREFIX = "audit:"
"""Keys of a txid's recorded output that its job measured for the commit's audit (issue 60):
``audit:input`` (the batch read) and ``audit:<lake sink>`` (the rows written for it), each a
list of measurements (``rules.expectations.Measured`` as dicts), judged by the commit."""


def lake_output_key(sink: str) -> str:
    """The key of what the lake sink ``sink`` staged in a txid's recorded output."""
    return f"{LAKE_OUTPUT_PREFIX}{sink}"


def audit_output_key(on: str) -> str:
    """The key of the job's measurements of ``on`` (the input batch or a lake sink) in a txid's
    recorded output."""
    return f"{AUDIT_OUTPUT_PREFIX}{on}"


class FailureResponse(StrEnum):
    """What the failure sensor of a txid's run did about a failed attempt (the log records it)."""

    REQUEUE = "requeue"
    """Restart the txid's run and the runs of every later txid, in one request: each begin
    re-emits its txid with a new attempt, in order. One request per cascade, not one per run: a
    herd of simultaneous restarts races Airflow's scheduler (it has died of it)."""
    LEAVE_TO_ORIGIN = "leave_to_origin"
    """The txid failed in a cascade from an earlier txid, whose sensor re-queues this run."""
    STOP = "stop"
    """Poison batch: the txid failed on its own ``max_attempts`` times. Its run is not restarted,
    says why, and every later txid waits for it (no silent skip) until a person reruns it."""


class EventState(StrEnum):
    """What a trigger's event tells the task it wakes (its payload's ``state``; the event:
    :class:`~airflow_txn_provider.rules.waiting.TxnEvent`)."""

    CAN_BEGIN = "can_begin"
    """The txid may begin: ``txid - 1`` is (re-)initialised and the window has room."""
    OPEN = "open"
    """The attempt may commit now: ``txid - 1`` committed (or, started in the triggerer, nobody
    else commits the ready txid)."""
    COMMITTED = "committed"
    """The txid committed."""
    STALE = "stale"
    """The attempt was failed or replaced: it must not commit."""
    UNFINISHED = "unfinished"
    """The attempt still processes although the tasks before the commit ended."""
    FAILED = "failed"
    """An attempt newer than the watched one failed."""
    NOT_REQUEUED = "not_requeued"
    """The failed attempt could replay but its run was not restarted in time."""
    LEASE_EXPIRED = "lease_expired"
    """The processing attempt's lease ran out: its process is gone."""
    MANUAL_RUN = "manual_run"
    """Started in the triggerer for a run that is no txid's: its task knows what to do."""
    ALERT = "alert"
    """An alert is due and unsent (a stall, a poison batch's): its attempt is the one watched."""


# -- what the rules answer ---------------------------------------------------------------------


class BeginAction(StrEnum):
    """What :func:`~airflow_txn_provider.rules.coordinator.plan_begin` answers."""

    NEW = "new"
    """First emission of a new txid, attempt 1: initialise its metadata from ``txid - 1``'s."""
    REPLAY = "replay"
    """Re-emission of a failed txid with a new attempt."""
    REEMIT = "reemit"
    """Re-emission of a txid whose processing attempt's lease ran out (its process is gone): the
    attempt is failed first, with the cascade of :func:`plan_failure`."""
    RESUME = "resume"
    """The txid's current attempt is alive (processing under a live lease, or processed): begin
    hands out that same attempt again. A retried or duplicated begin (Airflow may report a
    finished task as lost and run it again) must never re-emit what its first try claimed."""
    ALREADY_COMMITTED = "already_committed"
    """Nothing to do: the txid committed already."""
    WAIT_PREVIOUS = "wait_previous"
    """``txid - 1`` has not (re-)initialised its metadata yet; metadata is initialised in order."""
    WAIT_WINDOW = "wait_window"
    """The txid is beyond the ``max_pending`` window."""
    NOT_REPLAYED = "not_replayed"
    """The txid's current attempt failed and this begin may not replay it (``replay=False``): the
    answer to a failure, replay or stop at a poison batch, belongs to whoever watches failures.
    An Airflow retry of a claim that already failed must not add an attempt behind its back."""


class ProcessedAction(StrEnum):
    """What :func:`~airflow_txn_provider.rules.fencing.plan_processed` answers."""

    ACCEPT = "accept"
    """Record the output and mark the txid processed."""
    DUPLICATE = "duplicate"
    """The same attempt already recorded the same output (a duplicate run): nothing to do."""
    IGNORE_STALE = "ignore_stale"
    """A late report from an attempt that is no longer current: ignored, as in Storm."""


class CommitAction(StrEnum):
    """What :func:`~airflow_txn_provider.rules.coordinator.plan_commit` answers."""

    APPLY = "apply"
    """Apply the attempt's output and mark the txid committed, in one database transaction."""
    ALREADY_COMMITTED = "already_committed"
    """Idempotent commit: the txid committed already; nothing is applied twice."""


class SinkAction(StrEnum):
    """What :func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit` answers."""

    ADD = "add"
    """The lake table does not hold this txid yet: add the attempt's output in one table commit."""
    ALREADY_IN_TABLE = "already_in_table"
    """The table holds this very attempt of the txid (a commit that crashed after the table
    commit, before the log's; a fill killed after some of its chunk's table commits): complete
    the log's commit without adding anything twice."""
    REPLACE = "replace"
    """The table holds the txid from another attempt (a commit that failed after this table's
    commit, e.g. at another sink, and replayed), or later txids a rewind undid in the log:
    rewind the table to the txid before, then add this attempt's output. A table holds, for a
    txid, the rows of exactly one attempt: the one the log commits."""


class LeaseRenewal(StrEnum):
    """What renewing an attempt's lease finds."""

    RENEWED = "renewed"
    """Still processing: the lease was extended."""
    DONE = "done"
    """Its output is recorded (processed, or committed since): nothing left to prove alive, and
    nothing to stop (its process may still be shutting down Spark)."""
    LOST = "lost"
    """Failed or replaced: its work will never count, so its process should stop."""
