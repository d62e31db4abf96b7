"""OpenLineage for a txid's run: what a lineage catalog (Marquez, DataHub) receives.

The OpenLineage provider's listener asks each task of a txid's run for its lineage when it ends;
the answers are built here. Every task that knows its txid adds the run facet
``airflowTxn_transaction``; the claim and the processing jobs name the source as input, with the
attempt's batch in ``airflowTxn_batch``; the commit, once its txid committed, names every state
and lake table as outputs (a lake table with its version and ``outputStatistics``). An attempt
that did not commit names no output. The custom facets' schemas ship in ``lineage_schemas/``.
Datasets follow OpenLineage's naming spec, a lake table named by its storage location as its
Spark integration does (an Iceberg table's catalog name in ``symlinks``). The OpenLineage client
is imported only when a listener asks.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from airflow_txn_provider import __version__
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
) -> Any:
    """The ``OperatorLineage`` of one task of a txid's run.

    :param claim: the run's claim (``txid``, ``attempt``, ``metadata``); ``None`` when the task
        ended before it knew its txid: nothing but an empty answer then.
    :param reads_batch: the task reads the batch (the source is its input).
    :param committed_output: the output the log recorded for the txid, once it committed (only
        then are there outputs).
    :param log_url: the transaction log's URL (where the state tables live), for the outputs.
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
    source = txn_pipeline.source.lineage_dataset() if reads_batch else None
    if source is not None:
        batch = {BATCH_FACET: batch_facet(batch=claim.get("metadata"), producer=PRODUCER)}
        inputs.append(InputDataset(*source, inputFacets=batch))
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
        )

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """As on completion, never with outputs: a failed task committed nothing."""
        return task_lineage(self.txn_pipeline, self._lineage_claim, reads_batch=self.reads_batch)
