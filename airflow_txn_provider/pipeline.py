"""A pipeline declared in a few lines, as Storm's ``TransactionalTopologyBuilder`` declared one.

    pipeline = TxnPipeline(
        name="words",
        source=PartitionedParquetSource("/data/words", max_per_partition=100_000),
        jobs=["spark_jobs/word_count.py"],
        states=[MapState("words", "word_counts", "transactional", keys={"word": "text"})],
    )
    dag = build_dag(pipeline)      # airflow_txn_provider.dag_builder

Everything the Airflow side needs to know about the pipeline, in one frozen value that every
operator of its DAG receives.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_txn_provider.compat.spark import DEFAULT_SPARK_MODE
from airflow_txn_provider.log.health import STALL_AFTER
from airflow_txn_provider.rules.config import (
    DEFAULT_KEEP_TXIDS,
    FITTED_WINDOW_BOUND,
    validate_keep_txids,
    validate_max_pending,
)
from airflow_txn_provider.rules.expectations import (
    INPUT,
    Check,
    Expectation,
    check_declared,
)
from airflow_txn_provider.rules.filling import FILL_CHUNK
from airflow_txn_provider.rules.names import PIPELINE, check_name
from airflow_txn_provider.rules.vocabulary import OutputRetirement, OutputStart
from airflow_txn_provider.sinks.base import LakeSink
from airflow_txn_provider.sources.base import SparkSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.declaration import output_choices

SPARK_MODES = ("connect", "submit")


@dataclass(frozen=True)
class TxnPipeline:
    """
    :param name: pipeline name (and, by default, the DAG id).
    :param source: where batches come from.
    :param jobs: processing job files (``spark_jobs/…``); several run in parallel per txid.
    :param states: the states the jobs stage into and the commit applies.
    :param max_pending: txids in flight at most (processing in parallel). ``None`` (the
        default): the window fits the Spark the txids run on, one txid per core it offers and
        one more, up to 16 (:func:`~airflow_txn_provider.rules.config.fitted_window`;
        ``docs/spark.md``, "How many txids process at once"). A number is the window, whatever
        the Spark.
    :param max_attempts: poison-batch policy: a txid that failed this many times stops the
        pipeline (visibly: its run fails and later txids wait) instead of retrying forever.
    :param spark: ``connect`` (Spark Connect server, no JVM start per txid) or ``submit``; by
        default ``connect`` where the PySpark beside Airflow has Spark Connect (4.0 on), else
        ``submit``.
    :param reuse_spark_sessions: with ``spark="connect"``, a txid attaches to one of the
        pipeline's server sessions, kept from txid to txid (a temporary view or setting a
        transform makes may still be there later; ``docs/deployment.md``); ``False``: a new
        server session per txid.
    :param poll_interval: seconds between the deferred sensors' looks at the log (> 0).
    :param lease_timeout: seconds after which a processing attempt whose process stopped renewing
        its lease (killed, out of memory, a lost worker) is failed and replayed. A live job renews
        it every ``lease_timeout / 5`` seconds, however long it runs.
    :param keep_txids: retention: how many of the newest committed txids keep their history,
        in the transaction log (each txid's record and attempts; older ones are deleted by the
        commits and counted in the pipeline's pruned totals) and in Airflow (older txids' DAG
        runs, with their task instances and XComs, are deleted through the REST API). Default
        1000; at least ``max_pending`` is sensible, and at least the 200 txids the Transactions
        page lists. See "Retention" in ``docs/airflow.md``.
    :param sinks: lake tables the txids commit into (:class:`~airflow_txn_provider.sinks.
        DeltaSink`, :class:`~airflow_txn_provider.sinks.IcebergSink`), each exactly once, in
        txid order; each commit also updates the sink's Airflow Asset (``assets``). A pipeline
        with sinks has one processing job. See ``docs/lake.md``.
    :param alert_notifiers: Airflow notifiers (``BaseNotifier``, e.g. the SMTP provider's
        ``SmtpNotifier``) told once when a txid is poisoned and once per stall
        (:mod:`airflow_txn_provider.log.alerts`; "Alerts" in ``docs/airflow.md``).
    :param stall_alert_after: seconds without progress while txids wait after which the
        notifiers hear of a stall (default 600, the health endpoint's).
    :param start: how an output (state or sink) added once the pipeline has begun txids starts,
        by name: ``"next_txid"`` (:class:`~airflow_txn_provider.rules.vocabulary.OutputStart`): it
        holds the txids from the next one on, and the log, the Transactions page and the health
        endpoint say from which; or ``"history"``: the pipeline's fill DAG (``<dag_id>__fill``)
        computes it over every committed txid beside the live txids, and it joins them, complete
        from txid 1 (``docs/changing-a-pipeline.md``). Without it such a declaration is refused
        (:class:`~airflow_txn_provider.rules.exceptions.OutputStartRequiredError`); an output
        declared with the pipeline needs none. See "Adding and removing outputs" in
        ``docs/airflow.md``.
    :param retired: outputs no longer declared, by name: ``"keep"`` (their tables stay, no
        longer updated) or ``"drop"`` (a state's tables are dropped; a lake table never is).
        Removing an output that holds committed txids without it is refused
        (:class:`~airflow_txn_provider.rules.exceptions.OutputRemovedError`).
    :param fill_chunk: committed txids a fill from history computes in one Spark job (and
        applies in one Postgres transaction): its memory is one chunk's results.
    :param expectations: data-quality expectations each txid is audited against before its
        commit (:mod:`airflow_txn_provider.rules.expectations`: ``RowCondition``, ``RowCount``,
        ``RowCountWithinSigma``, ``FailingShare``, ``Check``), each ``on=`` a state, a lake sink
        or the input batch (``"input"``), with an action: ``warn``, ``drop`` (failing rows go to
        the quarantine; states only) or ``fail`` (the txid stops the pipeline, a poison batch).
        See "Expectations" in ``docs/airflow.md``.
    """

    name: str
    source: SparkSource
    jobs: Sequence[str | os.PathLike[str]]
    states: Sequence[MapState]
    max_pending: int | None = None
    max_attempts: int = 3
    spark: str = DEFAULT_SPARK_MODE
    txn_log_conn_id: str = "txn_log_default"
    spark_conn_id: str = "spark_default"
    spark_connect_conn_id: str = "spark_connect_default"
    reuse_spark_sessions: bool = True
    airflow_api_conn_id: str = "airflow_api_default"
    poll_interval: float = 1.0
    lease_timeout: float = 30.0
    keep_txids: int = DEFAULT_KEEP_TXIDS
    spark_conf: dict[str, str] = field(default_factory=dict)
    sinks: Sequence[LakeSink] = ()
    alert_notifiers: Sequence[Any] = ()
    stall_alert_after: float = STALL_AFTER
    start: Mapping[str, OutputStart | str] = field(default_factory=dict)
    retired: Mapping[str, OutputRetirement | str] = field(default_factory=dict)
    fill_chunk: int = FILL_CHUNK
    expectations: Sequence[Expectation] = ()

    def __post_init__(self) -> None:
        check_name(self.name, PIPELINE)
        validate_max_pending(self.max_pending)
        validate_keep_txids(self.keep_txids)
        if not self.lease_timeout > 0:
            raise ValueError(f"lease_timeout must be > 0 seconds, got {self.lease_timeout!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.fill_chunk < 1:
            raise ValueError(f"fill_chunk must be >= 1, got {self.fill_chunk}")
        if not (self.poll_interval > 0 and math.isfinite(self.poll_interval)):
            # 0 made the trigger poll the log in a busy loop
            raise ValueError(
                f"poll_interval must be a positive number of seconds, got {self.poll_interval!r}"
            )
        if not (self.stall_alert_after > 0 and math.isfinite(self.stall_alert_after)):
            raise ValueError(
                "stall_alert_after must be a positive number of seconds, got "
                f"{self.stall_alert_after!r}"
            )
        for notifier in self.alert_notifiers:
            if not callable(notifier):
                raise ValueError(
                    f"alert_notifiers takes Airflow notifiers (BaseNotifier), got {notifier!r}"
                )
        object.__setattr__(self, "alert_notifiers", tuple(self.alert_notifiers))
        if self.spark not in SPARK_MODES:
            raise ValueError(f"spark must be one of {SPARK_MODES}, got {self.spark!r}")
        if not self.jobs:
            raise ValueError(f"pipeline {self.name!r} needs at least one processing job")
        object.__setattr__(self, "jobs", tuple(os.fspath(j) for j in self.jobs))
        stems = [Path(j).stem for j in self.jobs]
        if len(set(stems)) != len(stems):
            raise ValueError(f"job file names must differ (they name the tasks): {stems}")
        for state in self.states:
            if state.pipeline != self.name:
                raise ValueError(
                    f"state {state.name!r} belongs to pipeline {state.pipeline!r}, "
                    f"not {self.name!r}"
                )
        object.__setattr__(self, "states", tuple(self.states))
        object.__setattr__(self, "sinks", tuple(self.sinks))
        names = [s.name for s in self.states] + [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"state and sink names must differ (they name outputs): {names}")
        starts, retirements = output_choices(self.start, self.retired)
        if set(starts) - set(names):
            raise ValueError(
                f"pipeline {self.name!r}: start= names {sorted(set(starts) - set(names))}, which "
                f"are not among its outputs {names}"
            )
        if set(retirements) & set(names):
            raise ValueError(
                f"pipeline {self.name!r}: {sorted(set(retirements) & set(names))} both declared "
                "and retired"
            )
        object.__setattr__(self, "start", starts)
        object.__setattr__(self, "retired", retirements)
        object.__setattr__(self, "expectations", self._checked_expectations())
        if self.sinks:
            if len(self.jobs) != 1:
                raise ValueError(
                    f"pipeline {self.name!r}: lake sinks need exactly one processing job, got "
                    f"{len(self.jobs)}"
                )

    def _checked_expectations(self) -> tuple[Expectation, ...]:
        """The expectations, each on a state (audited over its staged rows in Postgres), the
        input batch or a lake sink (measured by the Spark job, :mod:`airflow_txn_provider.spark.
        audit`: SQL expectations only); all judged in the commit."""
        found = check_declared(self.expectations)
        states, sinks = {s.name for s in self.states}, {s.name for s in self.sinks}
        for exp in found:
            where = "the input batch" if exp.on == INPUT else f"lake sink {exp.on!r}"
            if exp.on not in states | sinks | {INPUT}:
                raise ValueError(
                    f"pipeline {self.name!r}: expectation {exp.name!r} is on {exp.on!r}; "
                    f"expectations are checked on the pipeline's states {sorted(states)}, its "
                    f"lake sinks {sorted(sinks)} or the input batch (on='input')"
                )
            if exp.on in states:
                continue
            if isinstance(exp, Check) and exp.on == INPUT:
                raise ValueError(
                    f"pipeline {self.name!r}: expectation {exp.name!r} on {where}: a Check is "
                    "not supported there (the Spark job measures SQL expectations; a Check is "
                    "given a state's or a lake sink's staged rows in the commit)"
                )
            if exp.on == INPUT and len(self.jobs) != 1:
                raise ValueError(
                    f"pipeline {self.name!r}: expectation {exp.name!r} on the input batch needs "
                    f"exactly one processing job, got {len(self.jobs)} (not supported yet)"
                )
        return found

    @property
    def fits_window(self) -> bool:
        """Whether its window fits its Spark (no ``max_pending`` given): its txids say in the
        log how many cores their Spark offers."""
        return self.max_pending is None

    @property
    def window_bound(self) -> int:
        """The most txids it ever has in flight: ``max_pending``, or the fitted window's bound."""
        return FITTED_WINDOW_BOUND if self.max_pending is None else self.max_pending

    @property
    def assets(self) -> list[Any]:
        """One Airflow Asset per lake sink, updated by every committed txid (its extra carries
        ``pipeline``, ``txid`` and the table ``version``)."""
        from airflow.sdk import Asset

        return [
            Asset(name=f"txn:{self.name}:{sink.name}", uri=sink.uri, group="txn")
            for sink in self.sinks
        ]
