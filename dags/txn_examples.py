"""Data generators of the example DAGs of this folder, so each runs out of the box.

A helper module of the examples, not a DAG file (``.airflowignore`` keeps Airflow from parsing it)
and not part of the provider: copy it with the examples into the dags folder, which Airflow puts
on ``sys.path``, so ``from txn_examples import ...`` finds it there.

The words and global-count examples read :class:`~airflow_txn_provider.sources.generated.
GeneratedTextSource`, which needs no data at all. The opaque example reads a landing folder of
files, like a real opaque source; :class:`~airflow_txn_provider.sources.simulated_landing.
SimulatedLandingSource` (re-exported here) is that source with a producer built in: before
choosing each batch it writes the files that "producers" would have landed since the last batch,
into every partition folder that is online. It lives in the provider, not here, because the
pipeline's waker, in the triggerer, must import it too.

Taking a partition offline is renaming its folder so the source skips it (a leading dot), as an
unmounted share or a crashed producer would::

    python dags/txn_examples.py offline <landing folder> p1
    python dags/txn_examples.py online  <landing folder> p1

Done while a failed txid replays, the replay reads fewer files than its first attempt did: the
opaque state still commits each line exactly once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from airflow_txn_provider.sources.simulated_landing import (  # noqa: F401 - the examples' imports
    SimulatedLandingSource,
    landing_lines,
)

EXAMPLES_DATA_ENV = "TXN_EXAMPLES_DATA"


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
