"""What a txid's begin costs as the source's history grows: 10, 1 000 and 100 000 files.

Run with ``make bench-begin``. Three kinds of source: ``parquet`` (``PartitionedParquetSource``,
files with no offset in their name: changed folders are listed), ``parquet-named`` (the same
source with ``file_name_template``: files named by their first offset, Kafka Connect's
convention, looked up by name) and ``landing`` (``LandingDirectorySource``). For each, a dataset
of each history size (``--partitions`` partitions, files spread round-robin, a few small records
each) is generated once and kept under ``--cache`` (the system temp dir by default). Then, for
each dataset:

* a first begin (the previous txid's, untimed in the table's p50/p95 but printed as "first")
  runs in a fresh process against an empty catalog (what discovery found is kept in the log's
  Postgres: a throwaway one the benchmark starts, durable as a log's, on 127.0.0.1);
* ``--repeat`` times: ``--new-files`` files land in every partition, then a fresh Python process
  (no in-process cache warm; ``pyarrow.parquet`` imported before the clock starts, as a task
  process has its imports done) runs the begin path exactly as a task process does:
  ``source.prefetch()`` then ``source.initialize_transaction(txid, prev_metadata)``, with the
  previous txid's metadata. Its result is checked against the batch expected;
* then the idle poll ("no new data"): once the folders are more than 2 s old (the discovery
  catalog trusts only listings made well after a folder's last change), one untimed begin, then
  ``--repeat`` timed begins in fresh processes with nothing new (each must return ``None``);
* and the idle poll as a waker makes it: one source object in this process, bound to the log's
  catalog, polls ``--repeat`` times (prefetch, then the begin's step) after an untimed first
  poll that looks.

With ``--floor`` (and ``parquet`` among the kinds), after the largest ``parquet`` dataset: what
the listing of its changed folders cannot do without, each part timed alone in this process
(p50 of ``--repeat``): listing every partition's folder, reading every partition's known names
from the catalog in the log's Postgres (what a host compares the listing against), a stat of
every file (what telling new files by their ctime, without the known names, would cost), and the
two round trips to the catalog any begin makes whatever its source's history: reading the
dataset's partitions, and recording a look that found new files (here one per partition, under
another dataset's key), both on this process's warm connection, then both again as a begin in
a fresh process pays them (``--repeat`` processes, each with its connection open before the
clock, as a task process has the log's; its server process has not read the catalog yet).

Printed: p50 and p95 (nearest rank) begin seconds per history size, side by side, and the ratio
of the largest history's p50 to the smallest's (the goal is flat: 1x), for begins that find new
files and for idle polls ("no new data" rows). The files added by a run
are deleted at the start of the next run, so the cached datasets keep their size.

Usage: python benchmarks/bench_begin.py [--sizes 10,1000,100000] [--repeat 7] [--new-files 2]
       [--partitions 4] [--seed 11] [--kinds parquet,parquet-named,landing] [--cache DIR]
       [--floor]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from airflow_txn_provider.transactions.transaction_log import TransactionLog  # noqa: E402
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

ROWS_PER_FILE = 5
SEED = 11
NAMED = "part-{offset:010d}.parquet"
"""The ``parquet-named`` kind's files: named by their first offset."""
Result = tuple[float, list[float], list[float], list[float]]
"""A dataset's first begin, then begins, idle polls in fresh processes, a waker's idle polls."""
KINDS = {
    "parquet": "PartitionedParquetSource",
    "parquet-named": "PartitionedParquetSource, offset-named files",
    "landing": "LandingDirectorySource",
}

CONNECTED = """
import json, sys, time
import pyarrow.parquet  # a task process has its imports done: only the begin is timed
from sqlalchemy import create_engine, text
from airflow_txn_provider.sources.base import source_from_spec
from airflow_txn_provider.sources.catalog import Look, PostgresCatalog, with_log_catalog
args = json.loads(sys.argv[1])
engine = create_engine(args["url"], pool_pre_ping=True)
with engine.connect() as conn:  # as a task process's begin has the log's connection open
    conn.execute(text("SELECT 1"))
"""
"""A fresh process's start, untimed: its imports done, the log's connection open."""
CHILD = (
    CONNECTED
    + """
source = with_log_catalog(source_from_spec(args["spec"]), engine)
started = time.perf_counter()
source.prefetch()
metadata = source.initialize_transaction(args["txid"], args["prev"])
took = time.perf_counter() - started
print(json.dumps({"seconds": took, "metadata": metadata}))
"""
)
FLOOR_CHILD = (
    CONNECTED
    + """
catalog, n = PostgresCatalog(engine), args["n"]
started = time.perf_counter()
known = catalog.partitions(args["key"])
read = time.perf_counter() - started
looks = {p: Look({"": (1, n, 0)}, {f"{n}.parquet": (1, n, n, n)}) for p in known}
started = time.perf_counter()
recorded = catalog.record(args["key"] + ":floor-fresh", looks)
took = time.perf_counter() - started
print(json.dumps({"read": read, "record": took, "partitions": len(known), "put": len(recorded)}))
"""
)


# -- datasets ---------------------------------------------------------------------------------


def _spread(files: int, partitions: int) -> list[int]:
    """Files per partition, round-robin."""
    return [files // partitions + (1 if i < files % partitions else 0) for i in range(partitions)]


def _parquet_file(path: Path, first_offset: int, rng: random.Random) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    offsets = pa.array(range(first_offset, first_offset + ROWS_PER_FILE), pa.int64())
    lines = pa.array([f"w{rng.randrange(1000)} w{rng.randrange(1000)}" for _ in offsets])
    pq.write_table(pa.table({"offset": offsets, "line": lines}), path)


def _landing_file(path: Path, rng: random.Random) -> None:
    text = "".join(
        json.dumps({"line": f"w{rng.randrange(1000)} w{rng.randrange(1000)}"}) + "\n"
        for _ in range(ROWS_PER_FILE)
    )
    tmp = path.with_name(f".{path.name}.tmp")  # written whole, then renamed, as producers must
    tmp.write_text(text)
    tmp.replace(path)


def dataset(cache: Path, kind: str, files: int, partitions: int, seed: int) -> Path:
    """The cached dataset ``kind`` with ``files`` history files (generated on first use)."""
    root = cache / f"{kind}-{files}-p{partitions}-s{seed}"
    if (root / "_complete.json").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    rng = random.Random(f"{seed}/{kind}/{files}")
    for i, count in enumerate(_spread(files, partitions)):
        if kind.startswith("parquet"):
            folder = root / f"p={i}"
            folder.mkdir(parents=True)
            for k in range(count):
                first = k * ROWS_PER_FILE
                named = kind == "parquet-named"
                name = NAMED.format(offset=first) if named else f"part-{k:06d}.parquet"
                _parquet_file(folder / name, first, rng)
        else:
            folder = root / f"p{i}"
            folder.mkdir(parents=True)
            for k in range(count):
                _landing_file(folder / f"{k}.jsonl", rng)
    (root / "_complete.json").write_text(json.dumps({"files": files}))
    took = time.perf_counter() - started
    print(f"  generated {root} ({files} files) in {took:.1f} s", flush=True)
    return root


def reset(root: Path, kind: str, files: int, partitions: int) -> None:
    """Delete the files a previous run added (the dataset is back to ``files`` files)."""
    for i, count in enumerate(_spread(files, partitions)):
        if kind == "parquet":
            for extra in (root / f"p={i}").glob("new-*.parquet"):
                extra.unlink()
        elif kind == "parquet-named":
            for extra in (root / f"p={i}").glob("part-*.parquet"):
                if int(extra.name[5:15]) >= count * ROWS_PER_FILE:
                    extra.unlink()
        else:
            for extra in (root / f"p{i}").iterdir():
                match = re.fullmatch(r"(\d+)\.jsonl", extra.name)
                if match and int(match.group(1)) >= count:
                    extra.unlink()


# -- one begin in a fresh process ---------------------------------------------------------------


def begin_in_fresh_process(
    spec: dict[str, Any], txid: int, prev: Any, tmpdir: str, url: str
) -> Any:
    env = dict(os.environ, TMPDIR=tmpdir)
    child = {"spec": spec, "txid": txid, "prev": prev, "url": url}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(child)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"begin failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]


def measure(cache: Path, kind: str, files: int, args: argparse.Namespace, url: str) -> Result:
    """One dataset's :data:`Result`."""
    from airflow_txn_provider.sources.landing import LandingDirectorySource
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    root = dataset(cache, kind, files, args.partitions, args.seed)
    reset(root, kind, files, args.partitions)
    counts = _spread(files, args.partitions)
    rng = random.Random(f"{args.seed}/new/{kind}/{files}")
    if kind.startswith("parquet"):
        template = NAMED if kind == "parquet-named" else None
        source: Any = PartitionedParquetSource(
            str(root), max_per_partition=1_000_000, file_name_template=template
        )
        names = [f"{i}" for i in range(args.partitions)]
        ends = {p: n * ROWS_PER_FILE for p, n in zip(names, counts, strict=True)}
    else:
        source = LandingDirectorySource(str(root), max_files_per_partition=10)
        names = [f"p{i}" for i in range(args.partitions)]
        ends = {p: n for p, n in zip(names, counts, strict=True)}
    ends = {p: end for p, end in ends.items() if end > 0}
    spec = source.to_spec()
    # The previous txid ended at the end of the history: its begin warms what a begin keeps.
    prev: Any = {p: [max(end - 1, 0), end] for p, end in ends.items()}
    seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-begin-tmp-") as tmpdir:
        first = begin_in_fresh_process(spec, 1, prev, tmpdir, url)  # nothing new yet
        if first["metadata"] is not None:
            raise AssertionError(f"{kind} {files}: first begin {first['metadata']}, not None")
        added = 0
        for txid in range(2, args.repeat + 2):
            expected = {}
            for i, p in enumerate(names):
                end = ends.get(p, 0)
                for _ in range(args.new_files):
                    if kind.startswith("parquet"):
                        name = f"new-{added:06d}.parquet"
                        if kind == "parquet-named":
                            name = NAMED.format(offset=end)
                        _parquet_file(root / f"p={i}" / name, end, rng)
                        end += ROWS_PER_FILE
                    else:
                        _landing_file(root / p / f"{end}.jsonl", rng)
                        end += 1
                    added += 1
                expected[p] = [ends.get(p, 0), end]
            result = begin_in_fresh_process(spec, txid, prev, tmpdir, url)
            if result["metadata"] != expected:
                raise AssertionError(
                    f"{kind} {files} txid {txid}: {result['metadata']} != {expected}"
                )
            seconds.append(result["seconds"])
            prev = expected
            ends = {p: r[1] for p, r in expected.items()}
        time.sleep(2.2)  # the folders' last change is now old enough for a listing to be kept
        idle: list[float] = []
        for txid in range(args.repeat + 2, 2 * args.repeat + 3):
            result = begin_in_fresh_process(spec, txid, prev, tmpdir, url)
            if result["metadata"] is not None:
                raise AssertionError(f"{kind} {files} idle: {result['metadata']}, not None")
            if txid > args.repeat + 2:  # the first lists the folders once more, untimed
                idle.append(result["seconds"])
    polls = waker_polls(spec, txid + 1, prev, args.repeat, url)
    reset(root, kind, files, args.partitions)
    return first["seconds"], seconds, idle, polls


def waker_polls(spec: dict[str, Any], txid: int, prev: Any, repeat: int, url: str) -> list[float]:
    """Seconds of ``repeat`` idle polls as a waker makes them, one source object polling (the
    first poll, which looks, untimed)."""
    from sqlalchemy import create_engine

    from airflow_txn_provider.sources.base import source_from_spec
    from airflow_txn_provider.sources.catalog import with_log_catalog

    engine = create_engine(url, pool_pre_ping=True)
    waker = with_log_catalog(source_from_spec(spec), engine)
    polls: list[float] = []
    for i in range(repeat + 1):
        started = time.perf_counter()
        waker.prefetch()
        if waker.initialize_transaction(txid, prev) is not None:
            raise AssertionError(f"waker poll {i}: data where there is none")
        polls.append(time.perf_counter() - started)
    engine.dispose()
    return polls[1:]


def floor(cache: Path, files: int, args: argparse.Namespace, url: str) -> dict[str, list[float]]:
    """Seconds of each part a listing-mode begin cannot do without, on the ``parquet`` dataset
    of ``files`` files whose catalog :func:`measure` filled."""
    from sqlalchemy import create_engine

    from airflow_txn_provider.sources.catalog import Look, PostgresCatalog
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource

    root = dataset(cache, "parquet", files, args.partitions, args.seed)
    key = PartitionedParquetSource(str(root)).catalog_key()
    folders = sorted(str(path) for path in root.glob("p=*"))
    engine = create_engine(url)
    catalog = PostgresCatalog(engine)
    known = sorted(catalog.partitions(key))
    if len(known) != len(folders):
        raise AssertionError(f"catalog has partitions {known}, the dataset {folders}")

    def listing() -> int:
        return sum(len(os.listdir(folder)) for folder in folders)

    def names() -> int:  # one query for every partition, as a look asks for those it lists
        return sum(map(len, catalog.names(key, known).values()))

    def stats() -> int:
        return sum(
            entry.stat().st_ctime_ns > 0 for folder in folders for entry in os.scandir(folder)
        )

    def partitions() -> int:  # what every begin reads first, an idle poll's one query
        return len(catalog.partitions(key))

    recorded = iter(range(10**9))

    def record() -> int:  # a look that found a file in every partition (another dataset's key)
        n = next(recorded)
        looks = {p: Look({"": (1, n, 0)}, {f"{n}.parquet": (1, n, n, n)}) for p in known}
        return len(catalog.record(f"{key}:floor", looks))

    parts: dict[str, list[float]] = {}
    for label, part, least in (
        ("list every folder", listing, files),
        ("read the known names from the catalog", names, files),
        ("stat every file", stats, files),
        ("read the dataset's partitions from the catalog", partitions, len(known)),
        ("record a look that found a file in each partition", record, len(known)),
    ):
        counted, parts[label] = part(), []  # once untimed: the page cache and the pool warm
        for _ in range(args.repeat):
            started = time.perf_counter()
            if part() != counted:
                raise AssertionError(f"{label}: the count changed")
            parts[label].append(time.perf_counter() - started)
        if counted < least:
            raise AssertionError(f"{label}: {counted}, fewer than {least}")
    engine.dispose()
    fresh = [_fresh_round_trips(url, key, n) for n in range(args.repeat)]
    for got in fresh:
        if got["partitions"] != len(known) or got["put"] != len(known):
            raise AssertionError(f"a fresh process's round trips: {got}, not {len(known)}")
    parts["read the dataset's partitions, in a fresh process"] = [f["read"] for f in fresh]
    parts["record a look as above, in a fresh process"] = [f["record"] for f in fresh]
    return parts


def _fresh_round_trips(url: str, key: str, n: int) -> dict[str, Any]:
    """A fresh process's first read of the dataset's partitions and record of a look, timed."""
    child = json.dumps({"url": url, "key": key, "n": n})
    out = subprocess.run(
        [sys.executable, "-c", FLOOR_CHILD, child], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"round trips failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,100000", help="history sizes, in files")
    parser.add_argument("--repeat", type=int, default=7, help="timed begins per dataset")
    parser.add_argument("--new-files", type=int, default=2, help="files landed per partition")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "airflow-txn-bench-begin",
        help="where generated datasets are kept between runs",
    )
    parser.add_argument(
        "--floor", action="store_true", help="time the parts a listing cannot do without"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    if set(kinds) - set(KINDS):
        parser.error(f"--kinds: {sorted(set(kinds) - set(KINDS))} unknown")
    print(
        f"bench-begin: seed {args.seed}, sizes {sizes}, {args.partitions} partitions, "
        f"{args.new_files} new files per partition per txid, {args.repeat} begins each, "
        f"datasets in {args.cache}",
        flush=True,
    )
    args.cache.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, int], Result] = {}
    with EmbeddedPostgres() as pg:  # the log's Postgres, where the catalog lives
        url = pg.url
        TransactionLog.from_url(url).engine.dispose()  # its schema at head
        for kind in kinds:
            for files in sizes:
                results[kind, files] = measure(args.cache, kind, files, args, url)
                _progress(kind, files, results[kind, files])
        parts = floor(args.cache, sizes[-1], args, url) if args.floor and "parquet" in kinds else {}
    _table(kinds, sizes, results)
    if parts:
        at = f"{sizes[-1]} files, {args.partitions} partitions"
        print(f"\n| a listing's parts at {at} | ms p50 |")
        print("|---|---|")
        for label, values in parts.items():
            print(f"| {label} | {statistics.median(values) * 1000:.1f} |")
    return 0


def _progress(kind: str, files: int, result: Result) -> None:
    first, values, idle, _ = result
    print(
        f"  {kind} {files} files: first {first * 1000:.1f} ms, "
        f"p50 {statistics.median(values) * 1000:.1f} ms, "
        f"idle p50 {statistics.median(idle) * 1000:.1f} ms",
        flush=True,
    )


def _table(
    kinds: list[str],
    sizes: list[int],
    results: dict[tuple[str, int], Result],
) -> None:
    header = " | ".join(f"{n} files p50 / p95" for n in sizes)
    print(
        f"\n| begin, ms (fresh process; a waker's polls in one) | {header} | "
        f"first begin at {sizes[-1]} | "
        f"p50 {sizes[-1]}/{sizes[0]} |"
    )
    print("|---|" + "---|" * (len(sizes) + 2))
    for column, suffix in ((1, ""), (2, " (no new data)"), (3, " (no new data, a waker's polls)")):
        for kind in kinds:
            cells = []
            for files in sizes:
                values = results[kind, files][column]
                digits = 2 if column == 3 else 1  # a waker's poll: a few stat calls
                p50, high = statistics.median(values) * 1000, p95(values) * 1000
                cells.append(f"{p50:.{digits}f} / {high:.{digits}f}")
            small = statistics.median(results[kind, sizes[0]][column])
            large = statistics.median(results[kind, sizes[-1]][column])
            first = f"{results[kind, sizes[-1]][0] * 1000:.1f}" if column == 1 else "-"
            print(
                f"| {KINDS[kind]}{suffix} | {' | '.join(cells)} | {first} | {large / small:.1f}x |"
            )


if __name__ == "__main__":
    sys.exit(main())
