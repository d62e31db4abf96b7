"""Which log a Kafka txid's offsets belong to, and the check that it is still the same one.

Offsets alone do not name a log: a broker that lost its data, or a topic created again, starts
each partition at offset 0 again. Kafka tells such logs apart by the **topic id** and the
**leader epoch** (KIP-320); this module records both with each txid's metadata, and an
**anchor** per partition that any cluster can be asked (librdkafka's mock too): a record's
offset, epoch and fingerprint (timestamp, key, value). Another fingerprint at the anchor's offset
means another log. The :data:`LOG` note: ``{"topic_id": "<uuid>" | None, "anchors": {"words-0":
[offset, epoch, fingerprint, txid]}}`` (``txid``: the txid that took the anchor).
:func:`log_changes` is pure; :func:`read_anchors` asks the cluster. An anchor that retention or
compaction removed cannot be checked, and counts as no change.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from airflow_txn_provider.sources.kafka_read import consumer_settings, record_fingerprint

LOG = "log"
"""The metadata key of a Kafka txid's log identity (never a partition's key: those end in
``-<number>``)."""
RESET = "reset"
"""The metadata key of a txid that started partitions again on a new log (a declared reset):
``{partition: [old end, new start]}``."""

ANCHOR_FETCH_BYTES = 65_536
"""What one anchor read fetches per partition at most: it needs one record."""


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A record of a partition's log: where it is, the leader epoch it was written in, what it
    holds, and the txid that took it."""

    offset: int
    epoch: int | None
    fingerprint: str
    txid: int

    def to_json(self) -> list[Any]:
        return [self.offset, self.epoch, self.fingerprint, self.txid]

    @classmethod
    def from_json(cls, value: Any) -> Anchor:
        offset, epoch, fingerprint, txid = value
        return cls(int(offset), None if epoch is None else int(epoch), str(fingerprint), int(txid))


@dataclasses.dataclass(frozen=True)
class LogIdentity:
    """A topic's log as a txid recorded it: its topic id (``None`` where the cluster cannot say)
    and an anchor per partition."""

    topic_id: str | None
    anchors: Mapping[str, Anchor]
    after_reset: bool = False
    """Recorded by a txid that started partitions again on a new log (a declared reset)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": self.topic_id,
            "anchors": {k: a.to_json() for k, a in sorted(self.anchors.items())},
        }

    @classmethod
    def of(cls, metadata: Any) -> LogIdentity | None:
        """The identity a txid's metadata recorded (``None``: a txid of a version before it)."""
        note = dict(metadata or {}).get(LOG)
        if not note:
            return None
        anchors = {k: Anchor.from_json(v) for k, v in dict(note.get("anchors") or {}).items()}
        return cls(note.get("topic_id"), anchors, RESET in dict(metadata))


@dataclasses.dataclass(frozen=True)
class Seen:
    """What the log holds now at an anchor's offset: a record (``anchor``), a truncation the
    leader epoch revealed, the log ending before it, or nothing that can be checked."""

    anchor: Anchor | None = None
    truncated: bool = False
    ends_at: int | None = None
    """The log's end, when it ends at or before the anchor's offset."""
    detail: str = ""


def split_key(key: str) -> tuple[str, int]:
    """``"words-3"`` -> ``("words", 3)`` (a topic name may hold dashes; the partition never)."""
    topic, _, partition = key.rpartition("-")
    return topic, int(partition)


def log_changes(
    recorded: LogIdentity, topic_id: str | None, seen: Mapping[str, Seen]
) -> dict[str, str]:
    """Partitions whose log is no longer the one ``recorded``, each with what differs (pure).

    The topic id differs (both known): every recorded partition. Otherwise per partition: a
    truncation past the anchor (KIP-320), a log that now ends at or before the anchor, or another
    record at the anchor's offset. An anchor deleted or compacted away checks nothing."""
    if recorded.topic_id and topic_id and recorded.topic_id != topic_id:
        why = f"topic id was {recorded.topic_id}, now {topic_id} (the topic was created again)"
        return dict.fromkeys(sorted(recorded.anchors), why)
    changes: dict[str, str] = {}
    for key, anchor in sorted(recorded.anchors.items()):
        now = seen.get(key)
        if now is None:
            continue
        at = f"offset {anchor.offset} (leader epoch {anchor.epoch}, recorded by txid {anchor.txid})"
        if now.truncated:
            changes[key] = f"the log was truncated before {at}: {now.detail}"
        elif now.ends_at is not None:
            changes[key] = f"the log now ends at offset {now.ends_at}, before {at}"
        elif (
            now.anchor is not None
            and now.anchor.offset == anchor.offset
            and now.anchor.fingerprint != anchor.fingerprint
        ):
            changes[key] = (
                f"another record is at {at}: fingerprint {now.anchor.fingerprint}, recorded "
                f"{anchor.fingerprint} (the log was lost and written again)"
            )
    return changes


def read_anchors(
    config: Mapping[str, Any],
    topic: str,
    positions: Mapping[str, tuple[int, int | None]],
    marks: Mapping[str, tuple[int, int]],
    *,
    txid: int,
    timeout: float,
) -> dict[str, Seen]:
    """What each partition's log holds at ``positions`` (``{key: (offset, leader epoch)}``), with
    the partitions' ``marks`` (``(earliest, latest)``) read just before.

    One consumer, no group: each partition is assigned at its offset with the leader epoch, so
    librdkafka validates the position first (KIP-320) and reports a truncation; then the first
    record at or after the offset is the answer. Offsets below the earliest (deleted) are not
    read; at or past the latest, the log ends before them."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    seen: dict[str, Seen] = {}
    wanted: dict[tuple[str, int], str] = {}
    assign = []
    for key, (offset, epoch) in sorted(positions.items()):
        if key not in marks:
            continue  # unavailable now: its offsets check says so
        low, high = marks[key]
        if offset >= high:
            seen[key] = Seen(ends_at=high)
        elif offset >= low:
            topic_name, partition = split_key(key)
            wanted[(topic_name, partition)] = key
            tp = TopicPartition(topic_name, partition, offset)
            if epoch is not None and epoch >= 0:
                tp = TopicPartition(topic_name, partition, offset, leader_epoch=epoch)
            assign.append(tp)
    if not assign:
        return seen
    consumer = Consumer(
        {**consumer_settings(config), "max.partition.fetch.bytes": ANCHOR_FETCH_BYTES}
    )
    try:
        consumer.assign(assign)
        deadline = time.monotonic() + timeout
        while wanted and time.monotonic() < deadline:
            message: Any = consumer.poll(0.5)
            if message is None:
                continue
            where = (message.topic(), message.partition())
            found = wanted.get(where)
            if found is None:
                continue
            key = found
            error = message.error()
            if error is None:
                seen[key] = Seen(
                    anchor=Anchor(
                        message.offset(),
                        _epoch(message),
                        record_fingerprint(message),
                        txid,
                    )
                )
            elif "truncation" in error.str().lower():
                seen[key] = Seen(truncated=True, detail=error.str())
            elif error.code() not in (KafkaError._PARTITION_EOF,) and error.retriable():
                continue
            # else: EOF (markers or compaction up to the end) or out of range: nothing to check
            del wanted[where]
            consumer.pause([TopicPartition(*where)])
    finally:
        consumer.close()
    return seen


def _epoch(message: Any) -> int | None:
    epoch = message.leader_epoch()
    return int(epoch) if epoch is not None and epoch >= 0 else None


__all__ = ["LOG", "RESET", "Anchor", "LogIdentity", "Seen", "log_changes", "read_anchors"]
