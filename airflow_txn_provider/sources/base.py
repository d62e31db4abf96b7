"""The interface of a source that Spark reads, and how one is rebuilt in a Spark job.

A :class:`SparkSource` is a :class:`~airflow_txn_provider.rules.sources.Source` (it decides each
txid's metadata on the Airflow side, without Spark) that can also *read* its batch in the
processing job: the two halves of Storm's transactional spout. To write one, subclass one of the
two kinds and implement three methods (``docs/sources.md``). Sources are frozen dataclasses:
:meth:`SparkSource.to_spec` makes one JSON for a ``spark-submit`` command line, and
:func:`source_from_spec` rebuilds it in the job. The built-in sources live one to a module, e.g.
:class:`~airflow_txn_provider.sources.parquet.PartitionedParquetSource`,
:class:`~airflow_txn_provider.sources.landing.LandingDirectorySource` and
:class:`~airflow_txn_provider.sources.generated.GeneratedTextSource`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlparse

from airflow_txn_provider.rules.sources import Metadata, Source
from airflow_txn_provider.rules.specs import from_spec, to_spec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

LOCATION = "_txn_location"
"""Column of :meth:`SparkSource.malformed_records`: where the record is (file, line, offset)."""
RECORD = "_txn_record"
"""Column of :meth:`SparkSource.malformed_records`: the record as text."""


class SparkSource(Source):
    """A source whose batches a Spark job reads. Subclasses are frozen dataclasses."""

    @abstractmethod
    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        """The records of the batch that ``metadata`` describes, lazily (nothing runs yet).

        Read only what the metadata names (push the ranges down into the read). The frame may
        carry helper columns for :meth:`malformed_records`; :meth:`records` removes them.
        """

    def lineage_dataset(self) -> tuple[str, str] | None:
        """The source as an OpenLineage dataset, ``(namespace, name)`` (:mod:`~airflow_txn_provider.
        lineage`); ``None`` (the default): it has no name a lineage catalog would know."""
        return None

    def malformed_records(self, batch: DataFrame) -> DataFrame | None:
        """Rows of ``batch`` that cannot be processed, as columns ``LOCATION`` and ``RECORD``.

        ``None`` (the default) when the source cannot hold malformed records; the job then skips
        the check and its extra pass over the batch.
        """
        return None

    def records(self, batch: DataFrame) -> DataFrame:
        """``batch`` as the user's transform sees it (helper columns dropped)."""
        return batch

    def batch_counts(self, metadata: Metadata) -> dict[str, Column] | None:
        """Aggregates over the batch (``{name: column}``, e.g. the records of each partition) from
        which :meth:`counts_mismatch` tells whether the batch is whole; ``None`` (the default):
        the source cannot tell from its metadata how many records to expect.

        On Spark Connect the job computes them while the transform runs (``DataFrame.observe``),
        in the same pass over the batch; elsewhere in a pass of their own
        (:meth:`batch_mismatch`).
        """
        return None

    def counts_mismatch(self, counts: Mapping[str, Any], metadata: Metadata) -> str | None:
        """What the batch lacks against ``metadata``, judged from :meth:`batch_counts`' values,
        or ``None``."""
        return None

    def batch_mismatch(self, batch: DataFrame, metadata: Metadata) -> str | None:
        """What ``batch`` lacks against ``metadata`` (e.g. records a partition should hold), or
        ``None``. The job refuses a batch with a mismatch (:class:`~airflow_txn_provider.
        exceptions.IncompleteBatchError`) rather than commit it as if it were whole. By default,
        :meth:`batch_counts` in one pass of their own, judged by :meth:`counts_mismatch`."""
        counts = self.batch_counts(metadata)
        if not counts:
            return None
        row = batch.agg(*[column.alias(name) for name, column in counts.items()]).first()
        return self.counts_mismatch(row.asDict() if row is not None else {}, metadata)

    def describe_location(self, location: str, record: str) -> str:
        """Turn a ``LOCATION`` value into text a person can act on (e.g. add a line number)."""
        return location

    # -- passing a source to a Spark job ----------------------------------------------------------

    def driver_env(self) -> dict[str, str]:
        """Environment a ``spark-submit`` driver needs to read this source: the settings of the
        connections it names (credentials go there, never into the spec); ``{}`` by default."""
        return {}

    def to_spec(self) -> dict[str, Any]:
        """JSON-compatible description: ``{"class": "module:Name", "args": {...}}``."""
        return to_spec(self)


def source_from_spec(spec: Mapping[str, Any] | str) -> SparkSource:
    """Rebuild a source from :meth:`SparkSource.to_spec` output (a mapping or its JSON text)."""
    return cast(SparkSource, from_spec(spec, SparkSource, what="source"))


def local_path(file_uri: str) -> str:
    """The local path of a file Spark names by URI (``file:/x`` is ``/x``); other URIs as given."""
    parsed = urlparse(file_uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else file_uri
