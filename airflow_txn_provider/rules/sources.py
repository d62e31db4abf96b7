"""Source contracts: how a pipeline turns "the previous batch ended here" into the next batch.

A source is Storm's transactional spout *coordinator*: from a txid and the previous txid's
metadata it returns this txid's (e.g. per-partition offset ranges), or ``None`` when there is no
new data; the processing job reads the batch. A :class:`TransactionalSource`'s batch never
changes: it is asked once per txid and replays reuse the stored metadata. An
:class:`OpaqueSource`'s replay may differ: it is asked again on every replay, from the previous
txid's metadata, and opaque state keeps results exact. Metadata must come back from JSON *equal*
(no tuples, integer keys, NaN or objects) and fit in JSONB (no NUL), or it is refused at begin
with :class:`~airflow_txn_provider.rules.exceptions.UnreadableMetadataError` (STORM-2675).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow_txn_provider.rules.exceptions import OffsetsWentBackError, UnreadableMetadataError
from airflow_txn_provider.rules.vocabulary import SourceKind

Metadata = Any
"""JSON-compatible metadata: dicts with str keys, lists, str, int, finite float, bool, None."""


class Source(ABC):
    """Decides the metadata of each txid's batch. Subclass one of the two kinds below."""

    kind: ClassVar[SourceKind]
    replays_exactly: ClassVar[bool] = False
    """Whether reading a committed txid's recorded metadata again yields exactly the records it
    committed: what filling an output from history needs
    (:func:`~airflow_txn_provider.rules.filling.refuse_fill`)."""

    @abstractmethod
    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        """Return the metadata of ``txid``'s batch, or ``None`` if no new data is available yet.

        :param txid: the transaction being emitted.
        :param prev_metadata: metadata of ``txid - 1`` (``None`` for txid 1): the batch starts where
            that one ended.
        """

    def replay_metadata(
        self, txid: int, stored: Metadata, prev_metadata: Metadata | None
    ) -> Metadata | None:
        """The metadata a replay of ``txid`` reads, when the log reuses ``stored`` (a
        transactional source): ``stored`` itself, after whatever check the source can make that
        it still describes the same records (a Kafka source checks its log's identity and
        raises if the log was replaced). Only a reset the source's owner declared may answer
        other metadata (then from ``prev_metadata``, as a first emission would)."""
        return stored

    def prefetch(self) -> None:  # noqa: B027 (optional hook; most sources need none)
        """Read, before the log takes the pipeline's lock, what :meth:`initialize_transaction`
        will need (e.g. the footers of new files), so the lock is held for a cheap lookup only.

        Called by every begin; it must not decide anything (the batch is decided under the lock).
        A failure here is ignored: the same work is then done, and reported, under the lock.
        """


class TransactionalSource(Source):
    """A source that can re-read exactly the same batch for a txid (Storm's transactional spout)."""

    kind = SourceKind.TRANSACTIONAL
    replays_exactly = True


class OpaqueSource(Source):
    """A source whose replay of a txid may emit a different batch (Storm's opaque spout)."""

    kind = SourceKind.OPAQUE


def validate_metadata(
    metadata: Metadata, *, pipeline: str | None, txid: int | None, attempt: int | None
) -> Metadata:
    """Return ``metadata`` if it survives a JSON round trip unchanged; raise otherwise."""
    problem = _json_problem(metadata, "$")
    if problem is None:
        try:
            back = json.loads(json.dumps(metadata, allow_nan=False))
        except (TypeError, ValueError) as err:  # pragma: no cover - _json_problem is stricter
            problem = str(err)
        else:
            if back != metadata:  # pragma: no cover - _json_problem is stricter
                problem = "value changes through JSON"
    if problem is not None:
        raise UnreadableMetadataError(
            f"batch metadata cannot be stored as JSON unchanged: {problem}",
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )
    return metadata


def _json_problem(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        # JSON can carry it, Postgres JSONB cannot: it would fail at insert, as a raw SQL error
        return f"{path} contains a NUL character (\\u0000)" if "\x00" in value else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r} (not finite)"
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _json_problem(item, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (
                    f"{path} has key {key!r} of type {type(key).__name__} (JSON keys are strings)"
                )
            if "\x00" in key:
                return f"{path} has key {key!r}, which contains a NUL character (\\u0000)"
            found = _json_problem(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    return f"{path} is a {type(value).__name__} (JSON has no such type)"


def next_offset_ranges(
    prev_metadata: Mapping[str, list[int]] | None,
    latest_offsets: Mapping[str, int],
    *,
    max_per_partition: int,
    txid: int | None = None,
) -> dict[str, list[int]] | None:
    """Offset ranges ``{partition: [start, end)}`` of the batch after ``prev_metadata``.

    The usual metadata of a partitioned source (Kafka topics, Parquet partitions with an ``offset``
    column): each partition continues where the previous batch ended, and takes at most
    ``max_per_partition`` records up to ``latest_offsets[partition]`` (exclusive). A partition
    missing from ``latest_offsets`` (unavailable right now) continues later from where it stopped.
    Returns ``None`` when no partition has new records.

    A partition whose latest offset is *below* where the previous batch ended was rewritten or
    renumbered: that raises :class:`~airflow_txn_provider.rules.exceptions.OffsetsWentBackError`
    rather than waiting (clamping said "no new data" until the partition grew past its old end, then
    skipped the records in between).

    :param prev_metadata: the previous txid's ranges, ``None`` for txid 1.
    :param latest_offsets: for each available partition, one past its newest offset.
    :param max_per_partition: batch size cap per partition.
    :param txid: the txid being emitted, named in the error.
    """
    if max_per_partition < 1:
        raise ValueError(f"max_per_partition must be >= 1, got {max_per_partition}")
    starts = {p: int(r[1]) for p, r in (prev_metadata or {}).items()}
    ranges: dict[str, list[int]] = {}
    for partition in sorted(set(starts) | set(latest_offsets)):
        start = starts.get(partition, 0)
        if partition in latest_offsets:
            latest = int(latest_offsets[partition])
            if latest < start:
                raise OffsetsWentBackError(
                    f"partition {partition!r} went back: the previous batch ended at offset "
                    f"{start}, the source now ends at {latest} (rewritten or renumbered); "
                    "records from here would be skipped, so nothing is emitted",
                    txid=txid,
                )
            end = min(latest, start + max_per_partition)
        else:
            end = start  # unavailable: keep its position for a later batch
        ranges[partition] = [start, end]
    if all(end == start for start, end in ranges.values()):
        return None
    return ranges
