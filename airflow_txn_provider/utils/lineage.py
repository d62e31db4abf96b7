"""OpenLineage for a txid's run: what a lineage catalog (Marquez, DataHub) receives.

The OpenLineage provider's listener asks each task of a txid's run for its lineage when it ends;
the answers are built here. Every task that knows its txid adds the run facet
``airflowTxn_transaction``; the claim and the processing jobs name the source as input, with the
attempt's batch in ``airflowTxn_batch``; the commit, once its txid committed, names every state
and lake table as outputs (a lake table with its version and ``outputStatistics``). An attempt
that did not commit names no output. The commit of a pipeline with expectations names each
audited dataset as an input with the spec's ``dataQualityAssertions``, committed or not. The
custom facets' schemas ship in ``lineage_schemas/``.
Datasets follow OpenLineage's naming spec, a lake table named by its storage location as its
Spark integration does (an Iceberg table's catalog name in ``symlinks``). The OpenLineage client
is imported only when a listener asks.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from airflow_txn_provider import __version__
from airflow_txn_provider.rules.expectations import INPUT, Action, Taken
from airflow_txn_provider.rules.vocabulary import TxStatus

if TYPE_CHECKING:
    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.sinks.base import LakeSink
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

RUN_FACET = "airflowTxn_transaction"
"""The run facet's key: pipeline, txid, attempt, committed."""
BATCH_FACET = "airflowTxn_batch"
"""The source input's facet key: the attempt's batch (the txid's metadata)."""
QUALITY_FACET = "dataQualityAssertions"
"""The spec's input facet of a dataset's checks: one assertion per expectation an audit judged."""
MET = frozenset({str(Taken.PASSED), str(Taken.NOT_ENOUGH_HISTORY)})
"""Outcomes of an expectation the data met: an assertion's ``success``. Warned, dropped and failed
are not: the data failed the expectation, whatever its action then did."""
SEVERITY = {str(Action.FAIL): "error", str(Action.WARN): "warn", str(Action.DROP): "warn"}
"""An assertion's ``severity`` by action: ``error`` blocks the pipeline (the spec's meaning)."""
PROJECT_URL = "https://pypi.org/project/airflow-txn-provider/"
PRODUCER = f"{PROJECT_URL}{__version__}/"
"""The custom facets' ``_producer``: this provider, at its version."""
SCHEMAS = Path(__file__).with_name("lineage_schemas")
"""The custom facets' JSON schemas, shipped in the package: ``<Facet>.json``."""
SCHEMA_VERSION = "1-0-0"
"""The facets' schema version (SchemaVer, as the spec's own): part of each ``$id``, changed with
the schema only, so one version of a schema has one URL."""


def schema_url(facet: str) -> str:
    """The ``_schemaURL`` of custom facet ``facet``: its schema file's ``$id`` and definition."""
    return f"{PROJECT_URL}lineage_schemas/{SCHEMA_VERSION}/{facet}.json#/$defs/{facet}"


def path_dataset(path: str) -> tuple[str, str]:
    """``(namespace, name)`` of a file or table at ``path`` (an absolute path or a URI)."""
    if "://" not in path:
        return "file", os.path.abspath(path)
    parts = urlsplit(path)
    if parts.scheme == "file":
        return "file", parts.path
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def postgres_dataset(url: str, table: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``table`` in the database of SQLAlchemy ``url``."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    qualified = table if "." in table else f"public.{table}"
    return f"postgres://{u.host or 'localhost'}:{u.port or 5432}", f"{u.database}.{qualified}"


def lineage_enabled() -> bool:
    """Whether the OpenLineage provider is installed and configured (a transport is set)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


@functools.cache
def _facets() -> tuple[type, type]:
    """The facet classes, defined on first use (the OpenLineage client is optional)."""
    from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

    # The base classes name the spec's generic facet schema and the OpenLineage client's (or
    # Airflow's) producer: each facet names its own schema, and this provider.
    @attrs.define
    class AirflowTxnTransactionRunFacet(RunFacet):  # type: ignore[misc]
        """Which transaction a task of a txid's run worked for."""

        pipeline: str
        txid: int
        attempt: int | None
        committed: bool

        @staticmethod
        def _get_schema() -> str:
            return schema_url("AirflowTxnTransactionRunFacet")

    @attrs.define
    class AirflowTxnBatchInputDatasetFacet(InputDatasetFacet):  # type: ignore[misc]
        """The attempt's batch of the source: its metadata (e.g. partition -> offsets)."""

        batch: Any

        @staticmethod
        def _get_schema() -> str:
            return schema_url("AirflowTxnBatchInputDatasetFacet")

    return AirflowTxnTransactionRunFacet, AirflowTxnBatchInputDatasetFacet


def task_lineage(
    txn_pipeline: TxnPipeline,
    claim: Mapping[str, Any] | None,
    *,
    reads_batch: bool,
    committed_output: Mapping[str, Any] | None = None,
    log_url: str | None = None,
    expectations: Iterable[Mapping[str, Any]] = (),
) -> Any:
    """The ``OperatorLineage`` of one task of a txid's run.

    :param claim: the run's claim (``txid``, ``attempt``, ``metadata``); ``None`` when the task
        ended before it knew its txid: nothing but an empty answer then.
    :param reads_batch: the task reads the batch (the source is its input).
    :param committed_output: the output the log recorded for the txid, once it committed (only
        then are there outputs).
    :param log_url: the transaction log's URL (where the state tables live), for the outputs.
    :param expectations: the outcomes the attempt's audit recorded (:func:`~airflow_txn_provider.
        rules.expectations.outcome_record`): each audited dataset is an input, with its
        assertions in ``dataQualityAssertions`` (:func:`audited_datasets`).
    """
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import dataset_version_dataset as version
    from openlineage.client.facet_v2 import output_statistics_output_dataset as statistics

    def rows(n: int) -> dict[str, Any]:
        return {"outputStatistics": statistics.OutputStatisticsOutputDatasetFacet(rowCount=n)}

    if claim is None:
        return OperatorLineage()
    run_facet, batch_facet = _facets()
    run = {
        RUN_FACET: run_facet(
            pipeline=txn_pipeline.name,
            txid=int(claim["txid"]),
            attempt=claim.get("attempt"),
            committed=committed_output is not None,
            producer=PRODUCER,
        )
    }
    inputs = []
    quality = {
        where: {QUALITY_FACET: assertions_facet(outcomes)}
        for where, outcomes in audited_datasets(txn_pipeline, expectations, log_url).items()
    }
    source = txn_pipeline.source.lineage_dataset() if reads_batch else None
    if source is not None:
        batch = {BATCH_FACET: batch_facet(batch=claim.get("metadata"), producer=PRODUCER)}
        inputs.append(InputDataset(*source, inputFacets=batch | quality.pop(source, {})))
    inputs += [InputDataset(*where, inputFacets=facets) for where, facets in quality.items()]
    outputs = []
    done: Mapping[str, Any] = committed_output if committed_output is not None else {}
    for state in txn_pipeline.states if committed_output is not None else ():
        staged = done.get(state.output_key)
        stats = rows(staged) if isinstance(staged, int) else {}
        where = postgres_dataset(log_url or "postgresql://", state.table)
        outputs.append(OutputDataset(*where, outputFacets=stats))
    for sink in txn_pipeline.sinks if committed_output is not None else ():
        commit = (done.get(sink.output_key) or {}).get("commit") or {}
        facets: dict[str, Any] = {}
        if commit.get("version") is not None:
            facets["version"] = version.DatasetVersionDatasetFacet(
                datasetVersion=str(commit["version"])
            )
        symlinks = _symlinks(sink, log_url)
        if symlinks:
            facets["symlinks"] = symlinks
        outputs.append(
            OutputDataset(
                *sink.lineage_dataset(),
                facets=facets,
                outputFacets=rows(int(commit.get("rows", 0))),
            )
        )
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run)


def audited_datasets(
    txn_pipeline: TxnPipeline, outcomes: Iterable[Mapping[str, Any]], log_url: str | None
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """``(namespace, name)`` -> the outcomes on it, in the order recorded: an outcome on a state is
    on its table (named as the commit's output), on a lake sink on its table, on the input batch
    on the source; one on an output the pipeline no longer declares, on the source (the batch the
    output came from). Left out (logged) when that source has no name."""
    outcomes = list(outcomes)
    if not outcomes:
        return {}
    outputs: dict[str, tuple[str, str]] = {
        s.name: postgres_dataset(log_url or "postgresql://", s.table) for s in txn_pipeline.states
    }
    outputs.update((k.name, k.lineage_dataset()) for k in txn_pipeline.sinks)
    source = txn_pipeline.source.lineage_dataset()
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for outcome in outcomes:
        on = outcome.get("on")
        where = source if on == INPUT else outputs.get(str(on), source)
        if where is None:
            log.info(
                "expectation %r on %s: no dataset to name it on", outcome.get("expectation"), on
            )
            continue
        found.setdefault(where, []).append(outcome)
    return found


def assertions_facet(outcomes: Iterable[Mapping[str, Any]]) -> Any:
    """The spec's ``DataQualityAssertionsDatasetFacet`` of one dataset's recorded outcomes: per
    expectation its name (``assertion`` and ``name``), whether the data met it (``success``,
    :data:`MET`), :data:`SEVERITY`, the outcome's message and, in ``params``, what the audit
    counted and did. No sample keys: they are data, kept in the log."""
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dq

    return dq.DataQualityAssertionsDatasetFacet(
        assertions=[
            dq.Assertion(
                assertion=str(o["expectation"]),
                success=o.get("taken") in MET,
                severity=SEVERITY.get(str(o.get("action"))),
                name=str(o["expectation"]),
                description=o.get("message") or None,
                params={
                    k: o[k]
                    for k in ("on", "action", "taken", "rows_checked", "rows_failed")
                    if k in o
                },
            )
            for o in outcomes
        ]
    )


def _symlinks(sink: LakeSink, log_url: str | None) -> Any:
    """The ``symlinks`` facet of a lake table that a catalog names too (an Iceberg table), or
    ``None``. A catalog that cannot be looked up costs the facet, never the event."""
    from openlineage.client.facet_v2 import symlinks_dataset as symlinks

    try:
        names = sink.lineage_symlinks(log_url)
    except Exception as err:
        log.warning("sink %s: its catalog name is left out of the lineage: %s", sink.name, err)
        return None
    if not names:
        return None
    return symlinks.SymlinksDatasetFacet(
        identifiers=[
            symlinks.Identifier(namespace=ns, name=name, type=kind) for ns, name, kind in names
        ]
    )


class TxidLineage:
    """What the pipeline's operators answer the OpenLineage listener (a mixin of theirs).

    A task remembers its run's claim as it reads it (``_lineage_claim``); a task that ends
    before that answers with nothing.
    """

    txn_pipeline: TxnPipeline
    reads_batch = False
    """Whether the task reads the batch: its lineage names the source as its input."""
    commits = False
    """Whether the task commits: its lineage names the outputs once its attempt committed."""
    _lineage_claim: dict[str, Any] | None = None

    def txlog(self) -> TransactionLog:
        raise NotImplementedError

    def txn_log_url(self) -> str:
        """The log's URL (its connection's): the namespace its states are named in."""
        raise NotImplementedError

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The run's txid; the source with the batch (a task that reads it); the outputs (the
        commit task, once its attempt committed)."""
        claim, p = self._lineage_claim, self.txn_pipeline
        if not self.commits or claim is None:
            return task_lineage(p, claim, reads_batch=self.reads_batch)

        info = self.txlog().transaction(p.name, claim["txid"])
        committed = (
            info is not None
            and info.status is TxStatus.COMMITTED
            and info.attempt == claim["attempt"]
        )
        return task_lineage(
            p,
            claim,
            reads_batch=self.reads_batch,
            committed_output=(info.output or {}) if committed and info is not None else None,
            log_url=self.txn_log_url(),
            expectations=self._audit(claim),
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """As on completion, never with outputs: a failed task committed nothing. The commit
        still names what its attempt's audit found (a ``fail`` expectation fails it)."""
        claim, p = self._lineage_claim, self.txn_pipeline
        audit = self._audit(claim) if self.commits and claim is not None else ()
        log_url = self.txn_log_url() if audit else None
        return task_lineage(
            p, claim, reads_batch=self.reads_batch, log_url=log_url, expectations=audit
        )

    def _audit(self, claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """The outcomes the audit of the claim's attempt recorded; none read for a pipeline that
        declares no expectations. A read that fails costs the assertions, never the event."""
        p = self.txn_pipeline
        if not p.expectations:
            return ()
        try:
            attempts = self.txlog().attempts(p.name, claim["txid"])
        except Exception as err:
            log.warning(
                "pipeline=%s: its expectations are left out of the lineage: %s", p.name, err
            )
            return ()
        return next((a.expectations for a in attempts if a.attempt == claim["attempt"]), ())
