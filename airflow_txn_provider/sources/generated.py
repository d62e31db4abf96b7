"""The generated text source: lines of words made from a hash of their position (transactional).

It needs no data set and a replay reads the same lines, so the example DAGs run out of the box;
raise its rate and it is a load generator.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from airflow_txn_provider.rules.sources import Metadata, TransactionalSource, next_offset_ranges
from airflow_txn_provider.sources.base import SparkSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

GENERATED_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: line numbers count from here
DEFAULT_VOCABULARY = tuple(
    "the cow jumped over the moon man went to store four score and seven years ago "
    "dog apple storm trident batch commit replay spark airflow".split()
)


@dataclasses.dataclass(frozen=True)
class GeneratedTextSource(TransactionalSource, SparkSource):
    """Lines of words generated at a steady rate: a replayable source that needs no data set.

    Line ``n`` of partition ``p`` exists once ``lines_per_second`` lines per partition have been
    "written" since 2026-01-01 up to ``n``; its words are a hash of ``(seed, p, n, position)``,
    so a batch (``{p: [start, end)}``) reads the same lines on every replay, on any Spark
    worker, with nothing on disk. The first txid reads the newest ``max_per_partition`` lines,
    not everything since 2026-01-01; after a pause the pipeline catches up ``max_per_partition``
    lines per txid at a time.

    What the example DAGs run out of the box; also a load generator (raise the rate).

    :param lines_per_second: arrival rate per partition.
    :param max_per_partition: batch size cap per partition.
    :param partitions: number of partitions (``p0``, ``p1``, …).
    :param words_per_line: words in a line.
    :param seed: a different seed generates different text.
    :param vocabulary: the words drawn from.
    """

    lines_per_second: float = 20.0
    max_per_partition: int = 500
    partitions: int = 2
    words_per_line: int = 8
    seed: int = 0
    vocabulary: tuple[str, ...] = DEFAULT_VOCABULARY

    def __post_init__(self) -> None:
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        if self.lines_per_second <= 0:
            raise ValueError(f"lines_per_second must be > 0, got {self.lines_per_second}")
        for name in ("max_per_partition", "partitions", "words_per_line"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.vocabulary:
            raise ValueError("vocabulary must not be empty")

    # Airflow side -------------------------------------------------------------------------------

    def latest_offsets(self, now: float | None = None) -> dict[str, int]:
        import time

        elapsed = max((time.time() if now is None else now) - GENERATED_EPOCH, 0.0)
        newest = int(elapsed * self.lines_per_second)
        return {f"p{i}": newest for i in range(self.partitions)}

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        latest = self.latest_offsets()
        if prev_metadata is None:  # start at the newest lines, not at the epoch
            prev_metadata = {
                p: [max(end - self.max_per_partition, 0)] * 2 for p, end in latest.items()
            }
        # The offsets are the clock's: a worker whose clock is behind the one that began the
        # previous txid has no new lines yet, which is not a partition that went back.
        for p, (_, end) in dict(prev_metadata).items():
            if p in latest:
                latest[p] = max(latest[p], int(end))
        return next_offset_ranges(
            prev_metadata, latest, max_per_partition=self.max_per_partition, txid=txid
        )

    # Spark side ---------------------------------------------------------------------------------

    def read_batch(self, spark: SparkSession, metadata: Metadata) -> DataFrame:
        from pyspark.sql import functions as F

        words = F.array(*[F.lit(w) for w in self.vocabulary])
        frames = []
        for partition, (start, end) in sorted(dict(metadata).items()):
            if end <= start:
                continue
            rows = spark.range(int(start), int(end)).select(
                F.lit(partition).alias("p"), F.col("id").alias("offset")
            )
            picks = [
                F.element_at(
                    words,
                    (
                        F.pmod(
                            F.xxhash64(F.lit(self.seed), F.lit(partition), "offset", F.lit(i)),
                            F.lit(len(self.vocabulary)),
                        )
                        + 1
                    ).cast("int"),
                )
                for i in range(self.words_per_line)
            ]
            frames.append(rows.select("p", "offset", F.concat_ws(" ", *picks).alias("line")))
        if not frames:
            raise ValueError(f"metadata {metadata!r} names no lines")
        return functools.reduce(lambda a, b: a.unionByName(b), frames)
