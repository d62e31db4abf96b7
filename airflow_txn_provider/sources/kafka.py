"""Kafka topics as sources, after storm-kafka-client's transactional and opaque Trident spouts.

A txid's metadata is ``{"<topic>-<partition>": [start, end)}``, decided at begin from the
partitions' watermarks (the Apache Kafka provider's admin client), at most ``max_per_partition``
each, a new partition from its earliest record; the Spark side reads exactly those offsets
(:mod:`~airflow_txn_provider.sources.kafka_read`, or Spark's Kafka reader: ``reader="spark"``).
A :class:`KafkaSource` replay reads the same offsets, and records deleted by retention before a
txid read them stop the pipeline (``OffsetsDeletedError``). An :class:`OpaqueKafkaSource` replay
starts from the previous txid's end; deleted records are skipped, noted under :data:`SKIPPED` and
warned about (pair it with opaque state). Credentials come from the ``kafka_conn_id`` connection,
never a command line (:func:`~airflow_txn_provider.utils.credentials.kafka_config`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_txn_provider.rules.exceptions import (
    OffsetsDeletedError,
    SourceError,
    SourceLogChangedError,
)
from airflow_txn_provider.rules.sources import (
    Metadata,
    OpaqueSource,
    TransactionalSource,
    next_offset_ranges,
)
from airflow_txn_provider.sources.base import SparkSource
from airflow_txn_provider.sources.kafka_log import (
    LOG,
    RESET,
    LogIdentity,
    Seen,
    log_changes,
    read_anchors,
    split_key,
)
from airflow_txn_provider.sources.kafka_read import RANGE_SCHEMA, RECORD_SCHEMA, range_reader
from airflow_txn_provider.utils.credentials import kafka_config, kafka_connection_env

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SKIPPED = "skipped"
"""The metadata key of an opaque txid's note on records deleted before it could read them:
``{partition: [start, end)}`` of the offsets skipped. Never a partition's key (those end in
``-<number>``), and neither read nor continued from."""

READERS = ("arrow", "spark")
"""``arrow``: confluent-kafka in the Python workers (no jar); ``spark``: Spark's Kafka reader
(``spark-sql-kafka`` on the classpath)."""


def partition_key(topic: str, partition: int) -> str:
    """The metadata key of a topic-partition, as Kafka names it: ``words-3``."""
    return f"{topic}-{partition}"


NOTES = (SKIPPED, LOG, RESET)
"""The metadata's keys that are notes, not partitions."""


def offset_ranges(metadata: Metadata | None) -> dict[str, list[int]]:
    """A txid's ``{partition: [start, end)}``, without its notes (:data:`NOTES`)."""
    return {k: [int(r[0]), int(r[1])] for k, r in dict(metadata or {}).items() if k not in NOTES}


@dataclasses.dataclass(frozen=True)
class _KafkaTopic(SparkSource):
    """What both kinds share. ``topic``: the topic; ``kafka_conn_id``: the Airflow connection of
    the cluster; ``max_per_partition``: batch size cap per partition; ``reader``: one of
    :data:`READERS`; ``read_timeout``: seconds a read may go without progress before its txid
    fails (a broker down); ``request_timeout``: seconds for a begin's metadata requests;
    ``reset_log_from_txid``: an operator's declared reset after a partition's log was lost or
    the topic created again (:class:`~airflow_txn_provider.rules.exceptions.SourceLogChangedError`):
    from this txid on, a partition whose log is not the one a txid before it recorded starts
    again at the new log's earliest offset, noted in the txid's metadata under :data:`RESET`."""

    topic: str
    kafka_conn_id: str = "kafka_default"
    max_per_partition: int = 100_000
    reader: str = "arrow"
    read_timeout: float = 120.0
    request_timeout: float = 30.0
    reset_log_from_txid: int | None = None

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("topic must be a topic name")
        if self.reset_log_from_txid is not None and self.reset_log_from_txid < 1:
            raise ValueError(f"reset_log_from_txid must be >= 1, got {self.reset_log_from_txid}")
        if self.max_per_partition < 1:
            raise ValueError(f"max_per_partition must be >= 1, got {self.max_per_partition}")
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {list(READERS)}, got {self.reader!r}")

    # Airflow side -------------------------------------------------------------------------------

    def lineage_dataset(self) -> tuple[str, str]:
        """OpenLineage's name of a topic: ``kafka://<first bootstrap server>`` and the topic."""
        servers = str(kafka_config(self.kafka_conn_id)["bootstrap.servers"])
        return f"kafka://{servers.split(',')[0].strip()}", self.topic

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """Each partition of the topic now: ``(earliest, latest)`` offsets (latest: one past the
        newest record)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient(kafka_config(self.kafka_conn_id))
        try:
            topics = admin.list_topics(self.topic, timeout=self.request_timeout).topics
            found = topics.get(self.topic)
            if found is None or found.error is not None:
                why = found.error if found is not None else "no such topic"
                raise SourceError(f"Kafka topic {self.topic!r} cannot be read: {why}")
            parts = [TopicPartition(self.topic, p) for p in sorted(found.partitions)]
            offsets: dict[str, list[int]] = {}
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
                futures = admin.list_offsets(
                    {tp: spec for tp in parts}, request_timeout=self.request_timeout
                )
                for tp, future in futures.items():
                    key = partition_key(tp.topic, tp.partition)
                    offsets.setdefault(key, []).append(int(future.result().offset))
        except SourceError:
            raise
        except Exception as err:  # KafkaException: the cluster unreachable, the topic unknown
            raise SourceError(f"Kafka topic {self.topic!r}: {err}") from err
        return {key: (low, high) for key, (low, high) in offsets.items()}

    def topic_id(self) -> str | None:
        """The topic's id (a UUID it got at creation), or ``None`` where the cluster cannot
        describe topics (no controller in its metadata: librdkafka's mock cluster)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(kafka_config(self.kafka_conn_id))
        try:
            cluster = admin.list_topics(self.topic, timeout=self.request_timeout)
            if cluster.controller_id not in cluster.brokers:
                return None
            futures = admin.describe_topics(
                TopicCollection([self.topic]), request_timeout=self.request_timeout
            )
            found = futures[self.topic].result().topic_id
        except Exception as err:  # KafkaException: the cluster unreachable, the topic unknown
            raise SourceError(f"Kafka topic {self.topic!r}: {err}") from err
        return None if found is None else str(found)

    def log_now(
        self,
        positions: Mapping[str, tuple[int, int | None]],
        marks: Mapping[str, tuple[int, int]],
        txid: int,
    ) -> dict[str, Seen]:
        """What the partitions' logs hold at ``positions`` now
        (:func:`~airflow_txn_provider.sources.kafka_log.read_anchors`)."""
        if not positions:
            return {}
        try:
            return read_anchors(
                kafka_config(self.kafka_conn_id),
                self.topic,
                positions,
                marks,
                txid=txid,
                timeout=self.request_timeout,
            )
        except Exception as err:  # KafkaException: the cluster unreachable
            raise SourceError(f"Kafka topic {self.topic!r}: {err}") from err

    def _check_log(
        self,
        txid: int,
        recorded: LogIdentity | None,
        marks: Mapping[str, tuple[int, int]],
        topic_id: str | None,
        *,
        moved: bool = False,
    ) -> dict[str, str]:
        """The partitions whose log is no longer ``recorded``'s that a declared reset lets
        ``txid`` start again, with why; any other raises
        :class:`~airflow_txn_provider.rules.exceptions.SourceLogChangedError`. ``moved``: the
        replayed batch no longer follows the txid before it, which a reset moved to the new log
        (a rewind to the reset's txid replays the later ones): the reset covers it too."""
        if recorded is None:
            return {}
        reset = self.reset_log_from_txid
        seen = self.log_now(
            {k: (a.offset, a.epoch) for k, a in recorded.anchors.items()}, marks, txid
        )
        changes = log_changes(recorded, topic_id, seen)
        for key, why in changes.items():
            anchor = recorded.anchors[key]
            # A reset at N covers a log lost before N: an anchor taken by a txid before N, or by
            # N itself before the reset (its stored metadata carries no reset note yet).
            if (
                reset is not None
                and reset <= txid
                and (
                    moved
                    or anchor.txid < reset
                    or (anchor.txid == reset and not recorded.after_reset)
                )
            ):
                continue
            raise SourceLogChangedError(
                f"Kafka partition {key}: its log is not the one txid {anchor.txid} read: {why}. "
                "Its offsets now name other records, so nothing is read from them. To go on: "
                "rewind to a txid before the loss and declare the reset, or declare "
                f"reset_log_from_txid={txid} on the source (the partition starts again at the "
                "new log's earliest offset; what the old log held after the last committed txid "
                "is lost); see docs/sources.md, 'When a Kafka log is lost'",
                txid=txid,
                partition=key,
                recorded=f"topic id {recorded.topic_id}, offset {anchor.offset} "
                f"(epoch {anchor.epoch}) fingerprint {anchor.fingerprint}",
                current=f"topic id {topic_id}: {why}",
            )
        return changes

    def replay_metadata(
        self, txid: int, stored: Metadata, prev_metadata: Metadata | None
    ) -> Metadata | None:
        """A replay reads the stored offsets only from the log they were recorded on; with a
        declared reset covering the txid, it starts again on the new log instead."""
        recorded = LogIdentity.of(stored)
        if recorded is None:
            return stored
        marks = self.watermarks()
        ranges, before = offset_ranges(stored), offset_ranges(prev_metadata)
        moved = any(ranges[k][0] != before[k][1] for k in ranges.keys() & before.keys())
        changed = self._check_log(txid, recorded, marks, self.topic_id(), moved=moved)
        if not changed:
            return stored
        fresh = self.initialize_transaction(txid, prev_metadata)
        if fresh is not None:  # the note says this txid's batch moved to the new log
            was, now = offset_ranges(stored), offset_ranges(fresh)
            notes = fresh.setdefault(RESET, {})
            for key in changed:
                notes.setdefault(key, [was.get(key, [0])[0], now.get(key, [0])[0]])
        return fresh

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        marks = self.watermarks()
        topic_id = self.topic_id()
        recorded = LogIdentity.of(prev_metadata)
        reset = self._check_log(txid, recorded, marks, topic_id)
        starts = {k: r[1] for k, r in offset_ranges(prev_metadata).items()}
        restarted: dict[str, list[int]] = {}
        for key in reset:
            low = marks[key][0] if key in marks else 0
            restarted[key] = [starts.get(key, 0), low]
            starts[key] = low
            log.warning(
                "txid=%s Kafka partition %s starts again at offset %s of a new log (declared "
                "reset_log_from_txid=%s): %s",
                txid,
                key,
                low,
                self.reset_log_from_txid,
                reset[key],
            )
        skipped: dict[str, list[int]] = {}
        for key, (low, _high) in marks.items():
            start = starts.get(key)
            if start is None:
                starts[key] = low  # a partition new to the pipeline: from its earliest record
            elif start < low:
                starts[key] = self._deleted(txid, key, start, low)
                skipped[key] = [start, starts[key]]
        ranges: dict[str, Any] | None = next_offset_ranges(
            {k: [s, s] for k, s in starts.items()},
            {k: high for k, (_low, high) in marks.items()},
            max_per_partition=self.max_per_partition,
            txid=txid,
        )
        if ranges is None:
            return None
        if skipped:
            ranges[SKIPPED] = skipped  # the txid's note: stored, and shown with its offsets
        if restarted:
            ranges[RESET] = restarted
        identity = self._identity(txid, ranges, recorded, marks, topic_id, set(reset))
        if identity.topic_id or identity.anchors:
            ranges[LOG] = identity.to_json()
        return ranges

    def _identity(
        self,
        txid: int,
        ranges: Mapping[str, Any],
        recorded: LogIdentity | None,
        marks: Mapping[str, tuple[int, int]],
        topic_id: str | None,
        restarted: set[str],
    ) -> LogIdentity:
        """The log identity ``txid`` records: the newest record of each partition's range as
        its anchor; a partition with no new record keeps the one it had (not if it started
        again on a new log)."""
        anchors = {
            k: a for k, a in (recorded.anchors if recorded else {}).items() if k not in restarted
        }
        newest = {k: (r[1] - 1, None) for k, r in offset_ranges(ranges).items() if r[1] > r[0]}
        for key, seen in self.log_now(newest, marks, txid).items():
            if seen.anchor is not None:
                anchors[key] = seen.anchor
        return LogIdentity(topic_id, anchors)

    def _deleted(self, txid: int, key: str, start: int, low: int) -> int:
        """Where partition ``key`` continues when ``[start, low)`` was deleted before a txid
        read it: an error for a transactional source; the opaque one skips them."""
        raise NotImplementedError

    def driver_env(self) -> dict[str, str]:
        return kafka_connection_env([self.kafka_conn_id])

    # Spark side ---------------------------------------------------------------------------------

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        ranges = [(*split_key(k), s, e) for k, (s, e) in sorted(offset_ranges(metadata).items())]
        if self.reader == "spark":
            return self._spark_reader(spark, ranges)
        frame = spark.createDataFrame([r for r in ranges if r[3] > r[2]] or [], RANGE_SCHEMA)
        config = kafka_config(self.kafka_conn_id)
        identity = LogIdentity.of(metadata)
        anchors = {
            k: (a.offset, a.fingerprint) for k, a in (identity.anchors if identity else {}).items()
        }
        reader = range_reader(config, timeout=self.read_timeout, anchors=anchors)
        # one partition's range per task, read side by side
        spread = frame.repartition(max(1, sum(1 for r in ranges if r[3] > r[2])))
        return spread.mapInArrow(reader, RECORD_SCHEMA)

    def _spark_reader(self, spark: SparkSession, ranges: list[tuple[str, int, int, int]]) -> Any:
        """Spark's batch Kafka reader (``spark-sql-kafka``) over the same offsets."""
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for topic, partition, start, end in ranges:
            starting.setdefault(topic, {})[str(partition)] = start
            ending.setdefault(topic, {})[str(partition)] = end
        options = {f"kafka.{k}": str(v) for k, v in kafka_config(self.kafka_conn_id).items()}
        # As the default reader: a transactional producer's aborted records are never part of a
        # batch (Spark's Kafka reader reads uncommitted records unless told)
        options["kafka.isolation.level"] = "read_committed"
        return (
            spark.read.format("kafka")
            .options(**options)
            .option("assign", json.dumps({t: sorted(p) for t, p in _partitions(ranges).items()}))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("includeHeaders", "true")
            .option("failOnDataLoss", "true")
            .load()
        )


def _partitions(ranges: list[tuple[str, int, int, int]]) -> Mapping[str, list[int]]:
    found: dict[str, list[int]] = {}
    for topic, partition, _start, _end in ranges:
        found.setdefault(topic, []).append(partition)
    return found


@dataclasses.dataclass(frozen=True)
class KafkaSource(_KafkaTopic, TransactionalSource):
    """A Kafka topic, transactional: a txid's batch is the same offsets on every replay
    (``KafkaTridentSpoutTransactional``). See the module's docstring for the parameters."""

    def _deleted(self, txid: int, key: str, start: int, low: int) -> int:
        raise OffsetsDeletedError(
            f"Kafka partition {key}: offsets [{start}, {low}) were deleted by the topic's "
            "retention before any txid read them; a transactional source cannot skip records "
            "(raise the topic's retention, or use OpaqueKafkaSource to skip them)",
            txid=txid,
            partition=key,
        )


@dataclasses.dataclass(frozen=True)
class OpaqueKafkaSource(_KafkaTopic, OpaqueSource):
    """A Kafka topic, opaque: a replay re-reads from the previous txid's end and may take more
    (``KafkaTridentSpoutOpaque``); records deleted before they were read are skipped.

    A committed txid's offset ranges, read again while the topic keeps them, are the records it
    committed (a log replaced since is refused by its identity, a range retention deleted fails
    the read): an output may fill from history (``replays_exactly``)."""

    replays_exactly = True

    def _deleted(self, txid: int, key: str, start: int, low: int) -> int:
        log.warning(
            "txid=%s Kafka partition %s: offsets [%s, %s) were deleted by the topic's retention "
            "before any txid read them: skipped (%s records lost; noted in the txid's metadata "
            "under 'skipped')",
            txid,
            key,
            start,
            low,
            low - start,
        )
        return low


__all__ = [
    "READERS",
    "SKIPPED",
    "KafkaSource",
    "OpaqueKafkaSource",
    "offset_ranges",
    "partition_key",
    "split_key",
]
