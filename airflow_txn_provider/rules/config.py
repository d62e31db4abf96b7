"""The log's settings: its defaults and limits, and the checks of what a pipeline declares.

One place for every number a newcomer may want to tune or look up (how long a claim lasts, how
many txids retention keeps, how much it prunes at a time), so the rules, the log and the
declaration of a pipeline read the same values.
"""

from __future__ import annotations

# -- leases ------------------------------------------------------------------------------------

CLAIM_TIMEOUT = 120.0
"""Seconds a freshly begun attempt's lease lasts: time for its processing task to start and take
the lease over (it renews every few seconds from then on)."""
LEASE_TIMEOUT = 30.0
"""Seconds a processing attempt's lease lasts after each renewal, unless the pipeline says."""
LEASE_HOLDER_CHARS = 500
"""A lease holder's name is stored up to this many characters."""

# -- retention ---------------------------------------------------------------------------------

DEFAULT_KEEP_TXIDS = 1000
"""Committed txids whose rows (current record and attempt history) the log keeps, by default."""
PRUNE_BATCH = 500
"""At most this many txids are pruned by one call: a commit never stalls on a large backlog
(a log upgraded after a million txids catches up over a few thousand commits)."""
PRUNE_EVERY = 16
"""Pruning waits until this many txids are due: one DELETE per 16 commits, not one per commit."""

# -- the window: txids in flight ---------------------------------------------------------------

FITTED_WINDOW_BOUND = 16
"""The most txids in flight of a pipeline that declares no ``max_pending``: its window fits the
Spark its txids run on (:func:`fitted_window`), up to this."""
FIRST_WINDOW = 2
"""That pipeline's window until one of its txids has seen its Spark: what a one-core Spark
fits."""
TXIDS_PER_CORE = 1
"""Txids in flight per core of the Spark, each with a Spark job: more only share the cores."""
TXIDS_BESIDE_SPARK = 1
"""Txids in flight beyond one per core: the one starting, staging or committing while the others
compute, so no core waits for it."""
RUNS_AHEAD = 3
"""At most this many new txids past a full window have DAG runs made ahead of time, each claim then
waiting in its worker to begin (:func:`~airflow_txn_provider.rules.waiting.runs_ahead`). Airflow's
scheduler starts a new run's task up to about a second after the run is made (its idle sleep,
``[scheduler] scheduler_idle_sleep_time``, 1 s by default) and the task takes a few tenths more to
claim: one run ahead began only after the window had room, three begin as it moves
(docs/airflow.md)."""
RUN_LEAD = 1.5
"""Seconds from a DAG run's creation to its claim, about (the scheduler's idle sleep and the task's
start): a claim makes as many runs ahead as txids begin in that time
(:func:`~airflow_txn_provider.rules.waiting.runs_ahead_wanted`), so that slower txids do not keep
runs waiting in workers for several txids' time (each waiting second costs Airflow a running
task's heartbeats and the scheduler's look at one more run)."""


def spark_work_slots(window: int) -> int:
    """How many txids of a fitted ``window`` run their Spark work at once: all but the
    :data:`TXIDS_BESIDE_SPARK` (:data:`TXIDS_PER_CORE` per core), at least one
    (:mod:`airflow_txn_provider.spark.work_slots`)."""
    return max(1, window - TXIDS_BESIDE_SPARK)


def fitted_window(spark_cores: int, bound: int = FITTED_WINDOW_BOUND) -> int:
    """The window that fits a Spark offering ``spark_cores`` cores (its default parallelism):
    :data:`TXIDS_PER_CORE` txids in flight per core and :data:`TXIDS_BESIDE_SPARK` more, at
    least one, at most ``bound``: fewer leave the cores idle, more only share them
    (docs/spark.md, "How many txids process at once", has the measurements)."""
    if isinstance(spark_cores, bool) or not isinstance(spark_cores, int):
        raise TypeError(f"spark_cores must be an int, got {spark_cores!r}")
    if spark_cores < 1:
        return 1
    return min(bound, TXIDS_PER_CORE * spark_cores + TXIDS_BESIDE_SPARK)


# -- checks of a declaration -------------------------------------------------------------------


def validate_max_pending(max_pending: int | None) -> int | None:
    """``max_pending``: an int >= 1, or ``None`` (the window fits the pipeline's Spark)."""
    if max_pending is None:
        return None
    if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
        raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
    return max_pending


def validate_keep_txids(keep_txids: int) -> int:
    if isinstance(keep_txids, bool) or not isinstance(keep_txids, int) or keep_txids < 1:
        raise ValueError(f"keep_txids must be an int >= 1, got {keep_txids!r}")
    return keep_txids
