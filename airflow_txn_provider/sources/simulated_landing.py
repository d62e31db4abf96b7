"""A landing folder whose producers are simulated: what the landing examples (opaque, Iceberg) read.

:class:`SimulatedLandingSource` is a
:class:`~airflow_txn_provider.sources.landing.LandingDirectorySource` that, whenever a batch
is chosen or the waker asks whether one is due, first lands the files producers would have
written since into every online partition folder. It lives in the provider, like
:class:`~airflow_txn_provider.sources.generated.GeneratedTextSource`, so that the examples
run out of the box and every process that chooses batches imports it, the waker in the triggerer
(where the DAGs folder is not importable) included. A file's lines are :func:`landing_lines`: the
same for the same partition and number every time, so tests recount them in plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from pathlib import Path

from airflow_txn_provider.rules.sources import Metadata
from airflow_txn_provider.sources.generated import DEFAULT_VOCABULARY
from airflow_txn_provider.sources.landing import LandingDirectorySource

_STARTED = "_producer.json"
_NEXT_SEQ = ".next_seq"
"""Per partition folder: the next file number the simulated producer writes."""


def landing_lines(partition: str, seq: int, lines: int = 20, words: int = 6) -> list[str]:
    """The JSON lines of file ``seq`` of ``partition``: the same every time (tests recount them)."""
    rng = random.Random(f"{partition}/{seq}")
    return [
        json.dumps({"line": " ".join(rng.choice(DEFAULT_VOCABULARY) for _ in range(words))})
        for _ in range(lines)
    ]


@dataclasses.dataclass(frozen=True)
class SimulatedLandingSource(LandingDirectorySource):
    """A :class:`LandingDirectorySource` whose producers are simulated in-process.

    :param partitions: partition folders created on first use (``p0``, ``p1``, …).
    :param files_per_minute: files landed per online partition per minute.
    :param lines_per_file: JSON lines per file.
    """

    partitions: int = 3
    files_per_minute: float = 30.0
    lines_per_file: int = 20

    def produce(self, now: float | None = None) -> int:
        """Land the files due by ``now`` in every online partition; return how many were written.

        Files are numbered from when the folder was first used, written whole under a temporary
        name and renamed, as the source requires of real producers.
        """
        root = Path(self.path)
        root.mkdir(parents=True, exist_ok=True)
        now = time.time() if now is None else now
        marker = root / _STARTED
        if not marker.exists():
            for i in range(self.partitions):
                (root / f"p{i}").mkdir(exist_ok=True)
            _write_whole(marker, json.dumps({"started": now}))
        started = float(json.loads(marker.read_text())["started"])
        due = int((now - started) * self.files_per_minute / 60) + 1
        written = 0
        for partition in self.online_partitions():
            folder = root / partition
            # Numbering continues from the producer's own counter, not from the files present:
            # once consumed files are deleted, numbering from 0 again would land files the
            # source has already gone past.
            counter = folder / _NEXT_SEQ
            recorded = int(counter.read_text()) if counter.exists() else 0
            have = max(recorded, max(self.files(partition), default=-1) + 1)
            # A partition back from an outage resumes, without flooding a whole outage at once.
            end = max(have, min(due, have + self.max_files_per_partition))
            for seq in range(have, end):
                text = "\n".join(landing_lines(partition, seq, self.lines_per_file)) + "\n"
                _write_whole(folder / f"{seq}.jsonl", text)
                written += 1
            if end != recorded:
                _write_whole(counter, str(end))
        return written

    def online_partitions(self) -> list[str]:
        """The partition folders present (not taken offline), empty ones included."""
        return sorted(
            e.name
            for e in os.scandir(self.path)
            if e.is_dir() and not e.name.startswith((".", "_"))
        )

    def initialize_transaction(self, txid: int, prev_metadata: Metadata | None) -> Metadata | None:
        self.produce()
        return super().initialize_transaction(txid, prev_metadata)


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
