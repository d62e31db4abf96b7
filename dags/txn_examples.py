"""Data generators of the example DAGs of this folder, so each runs out of the box.

A helper module of the examples, not a DAG file (``.airflowignore`` keeps Airflow from parsing it)
and not part of the provider: copy it with the examples into the dags folder, which Airflow puts
on ``sys.path``, so ``from txn_examples import ...`` finds it there.

The words and global-count examples read :class:`~airflow_txn_provider.spark.generated_source.
GeneratedTextSource`, which needs no data at all. The opaque example reads a landing folder of
files, like a real opaque source; :class:`SimulatedLandingSource` is that source with a producer
built in: before choosing each batch it writes the files that "producers" would have landed since
the last batch, into every partition folder that is online.

Taking a partition offline is renaming its folder so the source skips it (a leading dot), as an
unmounted share or a crashed producer would::

    python dags/txn_examples.py offline <landing folder> p1
    python dags/txn_examples.py online  <landing folder> p1

Done while a failed txid replays, the replay reads fewer files than its first attempt did: the
opaque state still commits each line exactly once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_txn_provider.sources import Metadata
from airflow_txn_provider.spark.generated_source import DEFAULT_VOCABULARY
from airflow_txn_provider.spark.landing_source import LandingDirectorySource

EXAMPLES_DATA_ENV = "TXN_EXAMPLES_DATA"
_STARTED = "_producer.json"
_NEXT_SEQ = ".next_seq"
"""Per partition folder: the next file number the simulated producer writes."""


def examples_data_dir() -> Path:
    """Where example data lives: ``$TXN_EXAMPLES_DATA``, else ``$AIRFLOW_HOME/txn_examples``."""
    configured = os.environ.get(EXAMPLES_DATA_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "txn_examples"


SPARK_JOBS_ENV = "TXN_SPARK_JOBS"


def spark_job(dag_file: str, name: str) -> Path:
    """Path of job ``name``: under ``$TXN_SPARK_JOBS``, else ``spark_jobs/`` beside ``dags/``."""
    configured = os.environ.get(SPARK_JOBS_ENV)
    base = Path(configured) if configured else Path(dag_file).resolve().parents[1] / "spark_jobs"
    return base / name


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

    def to_spec(self) -> dict[str, Any]:
        """The spec of the plain :class:`LandingDirectorySource` of the same folder: a job (a
        ``spark-submit`` driver) only reads the batch, and this module, beside the DAGs, is not
        importable where the job runs; the producer runs where batches are chosen."""
        fields = {f.name for f in dataclasses.fields(LandingDirectorySource)}
        return {
            "class": f"{LandingDirectorySource.__module__}:{LandingDirectorySource.__qualname__}",
            "args": {k: v for k, v in dataclasses.asdict(self).items() if k in fields},
        }


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def set_partition_online(landing: Path, partition: str, online: bool) -> Path:
    """Rename ``partition``'s folder to or from its hidden offline name; return the new path."""
    live, hidden = landing / partition, landing / f".{partition}.offline"
    src, dst = (hidden, live) if online else (live, hidden)
    if dst.exists():
        return dst
    if not src.exists():
        raise FileNotFoundError(f"no partition {partition!r} under {landing}")
    src.rename(dst)
    return dst


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="take a landing partition offline or online")
    parser.add_argument("action", choices=["offline", "online"])
    parser.add_argument("landing", type=Path)
    parser.add_argument("partition")
    args = parser.parse_args(argv)
    try:
        path = set_partition_online(args.landing, args.partition, args.action == "online")
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.partition} is {args.action}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
