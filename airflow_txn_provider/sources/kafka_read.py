"""Reading Kafka offset ranges exactly, in Spark's Python workers, without Spark's Kafka jar.

A batch is a small DataFrame of ranges (one row per topic-partition, ``[start, end)``) mapped by
:func:`range_reader` with ``mapInArrow``: each task assigns its partitions to a confluent-kafka
consumer and reads exactly its range, joining no group and committing nothing to Kafka. The rows
have the columns of Spark's own Kafka source (:data:`RECORD_SCHEMA`). A range is read whole or
the task fails: records deleted by retention raise
:class:`~airflow_txn_provider.rules.exceptions.OffsetsDeletedError`, no progress for ``timeout``
seconds a ``TimeoutError`` (the txid replays from the same offsets). A consumer's position, not a
count of records, ends a range: compaction and transaction markers leave gaps in the offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from airflow_txn_provider.rules.exceptions import OffsetsDeletedError, SourceLogChangedError

RANGE_SCHEMA = "topic STRING, partition INT, start BIGINT, end BIGINT"
"""The ranges frame: one row per topic-partition of the batch."""
RECORD_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
    "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)
"""A record, as Spark's Kafka source (``includeHeaders``) has it."""
ROWS_PER_ARROW_BATCH = 10_000
TIMESTAMP_NOT_AVAILABLE = 0
"""librdkafka's timestamp type of a record without one."""
CONSUMER_GROUP = "airflow-txn-provider-unused"
"""librdkafka wants a ``group.id``; with ``assign`` and no commit, no group is ever joined."""


def record_fingerprint(message: Any) -> str:
    """What a record holds, in a few characters: its timestamp, key and value (CRC-32). A log's
    record at an offset never changes, so another fingerprint there is another log
    (:mod:`~airflow_txn_provider.sources.kafka_log`)."""
    import zlib

    kind, millis = message.timestamp()
    crc = zlib.crc32(f"{kind}:{millis}:".encode())
    for part in (message.key(), message.value()):
        crc = zlib.crc32(b"-" if part is None else b"+%d:" % len(part) + part, crc)
    return f"{crc:08x}"


def consumer_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a Kafka connection's settings) for a consumer that reads assigned ranges."""
    return {
        **config,
        "group.id": config.get("group.id", CONSUMER_GROUP),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",  # a deleted start offset is an error, never a jump
        # read committed: a transactional producer's aborted records are never part of a batch
        "isolation.level": "read_committed",
    }


def range_reader(
    config: Mapping[str, Any],
    *,
    timeout: float,
    anchors: Mapping[str, tuple[int, str]] | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that reads the ranges of :data:`RANGE_SCHEMA` batches into
    :data:`RECORD_SCHEMA` batches. ``config`` travels to the workers inside the function (a
    pickled closure, never a command line). ``anchors``: ``{"<topic>-<partition>": (offset,
    fingerprint)}`` of records the txid's metadata recorded; a range that holds another record
    there belongs to another log, and fails."""
    settings = consumer_settings(config)
    anchored = dict(anchors or {})

    def read(ranges: Iterator[Any]) -> Iterator[Any]:
        from confluent_kafka import Consumer

        consumer = Consumer(settings)
        try:
            for batch in ranges:
                for row in batch.to_pylist():
                    yield from read_range(
                        consumer,
                        row["topic"],
                        row["partition"],
                        row["start"],
                        row["end"],
                        timeout,
                        anchor=anchored.get(f"{row['topic']}-{row['partition']}"),
                    )
        finally:
            consumer.close()

    return read


def read_range(
    consumer: Any,
    topic: str,
    partition: int,
    start: int,
    end: int,
    timeout: float,
    *,
    anchor: tuple[int, str] | None = None,
) -> Iterator[Any]:
    """Arrow record batches of ``topic``'s ``partition``, offsets ``[start, end)``, exactly;
    the record at ``anchor``'s offset, if read, must have its fingerprint."""
    import time

    import pyarrow as pa
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    name = f"{topic}-{partition}"
    consumer.assign([TopicPartition(topic, partition, start)])
    rows: list[dict[str, Any]] = []
    position, last_progress = start, time.monotonic()
    try:
        while position < end:
            if time.monotonic() - last_progress > timeout:
                raise TimeoutError(
                    f"Kafka partition {name}: read offsets [{start}, {position}) of "
                    f"[{start}, {end}), then nothing for {timeout:.0f} s (a broker down or "
                    "unreachable?)"
                )
            message = consumer.poll(min(1.0, timeout))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    position = max(position, _position(consumer, topic, partition, position))
                    continue
                if error.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
                    raise OffsetsDeletedError(
                        f"Kafka partition {name}: offset {position} is no longer in the "
                        "partition's log: either the topic's retention deleted it, or the "
                        "broker lost its data (a restart or a replaced disk) and the log starts "
                        f"again below it; [{start}, {end}) cannot be read whole ({error.str()})",
                        partition=name,
                    )
                if error.fatal() or not error.retriable():
                    raise RuntimeError(f"Kafka partition {name}: {error.str()}")
                continue  # a transient error: librdkafka retries, progress is timed above
            offset = message.offset()
            last_progress = time.monotonic()
            position = offset + 1
            if offset >= end:
                break  # a gap ended the range just before: nothing of this record is ours
            if anchor is not None and offset == anchor[0]:
                _check_anchor(name, anchor, record_fingerprint(message))
            rows.append(_record(message))
            if len(rows) >= ROWS_PER_ARROW_BATCH:
                yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema())
                rows = []
    finally:
        consumer.unassign()
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema())


def _check_anchor(name: str, anchor: tuple[int, str], found: str) -> None:
    if found != anchor[1]:
        raise SourceLogChangedError(
            f"Kafka partition {name}: the record at offset {anchor[0]} is not the one the txid "
            f"recorded (fingerprint {found}, recorded {anchor[1]}): the log was lost and written "
            "again, and these offsets now hold other records",
            partition=name,
            recorded=anchor[1],
            current=found,
        )


def _position(consumer: Any, topic: str, partition: int, fallback: int) -> int:
    from confluent_kafka import TopicPartition

    (found,) = consumer.position([TopicPartition(topic, partition)])
    return int(found.offset) if found.offset >= 0 else fallback


def _record(message: Any) -> dict[str, Any]:
    kind, millis = message.timestamp()
    return {
        "key": message.key(),
        "value": message.value(),
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": millis * 1000 if kind != TIMESTAMP_NOT_AVAILABLE else None,
        # Spark's numbering: 0 CreateTime, 1 LogAppendTime (librdkafka's: 1 and 2; 0 is none)
        "timestampType": kind - 1 if kind != TIMESTAMP_NOT_AVAILABLE else None,
        "headers": [{"key": k, "value": v} for k, v in (message.headers() or [])],
    }


def arrow_schema() -> Any:
    """:data:`RECORD_SCHEMA` in Arrow."""
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(header)),
        ]
    )


__all__ = [
    "RANGE_SCHEMA",
    "RECORD_SCHEMA",
    "consumer_settings",
    "range_reader",
    "read_range",
    "record_fingerprint",
]
