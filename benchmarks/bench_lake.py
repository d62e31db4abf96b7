"""Rows/s into a lake table (Delta, Iceberg) through this project vs Spark writing the same Parquet
directly (no transaction), side by side.

Run with ``make bench-lake``. One run, the same data and the same transform on every side:

* the data: a Parquet dataset of 4 partitions, ``line`` = 8 words of a 1 000-word vocabulary
  (generated with a fixed, printed seed), one file per partition per batch, at each batch size
  (1e5 rows x 20 batches and 1e6 rows x 10 batches by default);
* the transform: ``spark_jobs/line_lengths.py``, each row as it is plus a derived column
  (``p, offset, line, chars``). A lake sink's typical load is rows in, rows out: an ingest or a
  per-row projection appended to a table. Word count (``spark_jobs/word_count.py``) would collapse
  a 1e6-row batch to at most 1 000 rows after a shuffle: the table write would be a few KB and the
  benchmark would time the aggregation, not the path into the table;
* **plain Spark** (the peer): one Spark Connect session that, per batch, reads the batch's files
  (schema given, ``p`` from the directory name), applies the transform, adds the batch's ``txid``
  and writes with
  ``df.write.mode("append").parquet(dir)``: no transaction, no log, nothing exactly-once;
* **this project, Delta** and **this project, Iceberg**: the core loop without Airflow, one txid
  after another: ``begin_next`` -> ``SparkConnectRunner.run`` with a ``DeltaSink`` (or an
  ``IcebergSink``, SQL catalog in the log's Postgres), ``txid_column="txid"`` (the executors write
  the attempt's Parquet into its staging directory, the job lists the files and records them in
  the log) -> ``commit_registered`` (exactly those files added in one table commit recording the
  txid, then the staging leftovers cleaned up).

All three sides use the same Spark Connect server (``local[2]``) and the same Postgres. Before any
timing, each side runs one throwaway batch (the JVM's JIT, the table libraries' imports, the
catalog's tables). Then the sides are interleaved batch by batch, in an order that rotates, so a
noisy neighbour on this machine slows each side alike; the ratios come from one run.

Printed: rows/s per side (rows / the sum of its batches' seconds), per-batch p50 / p95, the ratio
ours / plain (goal >= 0.8x; also from the p50s, which a neighbour's burst moves less), the load
average, and where a txid's time goes (p50 per part, from the job's recorded timings and timers
wrapped around the sink's functions; nothing is changed in what they do).

Checked exact at the end: for every txid, the rows of the Delta table and of the Iceberg table
(read back with ``deltalake`` and ``pyiceberg``) equal the plain Parquet output's rows of that batch
and the input's rows with ``chars`` computed by Arrow (sorted by partition and offset, compared
whole); the tables' total row counts equal the input's; each table records the last txid.

Usage: python benchmarks/bench_lake.py [--sizes 100000:20,1000000:10] [--seed 14] [--quick]
    [--keep] [--connect-url sc://127.0.0.1:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from airflow_txn_provider.sinks import DeltaSink, IcebergSink, LakeSink
from airflow_txn_provider.spark.connect_sessions import keep_classic_mode
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
JOB = ROOT / "spark_jobs" / "line_lengths.py"
from spark_jobs.line_lengths import transform  # noqa: E402
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

PARTITIONS = 4
WORDS_PER_LINE = 8
SEED = 14
VOCABULARY = [f"w{i}" for i in range(1000)]
COLUMNS = ["p", "offset", "line", "chars", "txid"]
SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}
QUICK_SIZES = "20000:3"


# -- the data ------------------------------------------------------------------------------------


def write_dataset(root: Path, batch_rows: int, batches: int, seed: int) -> None:
    """Batch ``b`` is file ``p=<i>/part-<b>.parquet`` of every partition ``i``, ``batch_rows / 4``
    rows each, offsets consecutive per partition: txid ``b + 1`` of a source taking
    ``batch_rows / 4`` offsets per partition reads exactly these files."""
    rng = np.random.default_rng(seed)
    vocabulary = pa.array(VOCABULARY)
    per = batch_rows // PARTITIONS
    for b in range(batches):
        for p in range(PARTITIONS):
            picks = rng.integers(0, len(VOCABULARY), size=(WORDS_PER_LINE, per))
            words = [vocabulary.take(pa.array(row)) for row in picks]
            directory = root / f"p={p}"
            directory.mkdir(parents=True, exist_ok=True)
            offsets = pa.array(np.arange(b * per, (b + 1) * per), pa.int64())
            line = pc.binary_join_element_wise(*words, " ")
            pq.write_table(pa.table({"offset": offsets, "line": line}), batch_file(root, p, b))


def batch_file(root: Path, p: int, b: int) -> Path:
    return root / f"p={p}" / f"part-{b:05d}.parquet"


def expected_rows(root: Path, b: int) -> pa.Table:
    """Ground truth for txid ``b + 1``: the batch's input rows, ``chars`` computed by Arrow."""
    parts = []
    for p in range(PARTITIONS):
        t = pq.read_table(batch_file(root, p, b))
        parts.append(
            pa.table(
                {
                    "p": pa.array([str(p)] * t.num_rows, pa.string()),
                    "offset": t["offset"],
                    "line": t["line"],
                    "chars": pc.utf8_length(t["line"]).cast(pa.int32()),
                    "txid": pa.array(np.full(t.num_rows, b + 1), pa.int64()),
                }
            )
        )
    return pa.concat_tables(parts)


def normalised(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in ``schema``'s order and types (string flavours differ by reader),
    sorted by partition and offset (unique per row), so two tables compare whole."""
    table = table.select(schema.names).cast(schema)
    return table.sort_by([("p", "ascending"), ("offset", "ascending")]).combine_chunks()


# -- timers around the sink's steps ---------------------------------------------------------------

SPENT: dict[str, float] = defaultdict(float)
"""Seconds spent so far in each wrapped function (a phase reads its difference)."""


def _timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _DEPTH[key]:  # called from within the same step (a fallback): counted once
            return fn(*args, **kwargs)
        _DEPTH[key] += 1
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[key] += time.perf_counter() - started
            _DEPTH[key] -= 1

    return wrapper


_DEPTH: dict[str, int] = defaultdict(int)


def instrument() -> None:
    """Timers around the lake sink's steps (behaviour unchanged): the listing of what Spark
    wrote, the table's look-ups, the table commit, finding its version, the cleanup."""
    from airflow_txn_provider.sinks import base, staging
    from airflow_txn_provider.sinks.delta import DeltaLakeTable
    from airflow_txn_provider.sinks.iceberg import IcebergLakeTable

    staging.list_staged = _timed("listing", staging.list_staged)
    base.LakeSink.commit = _timed("table commit", base.LakeSink.commit)  # type: ignore[method-assign]
    base.LakeSink.cleanup = _timed("cleanup", base.LakeSink.cleanup)  # type: ignore[method-assign]
    for cls in (DeltaLakeTable, IcebergLakeTable):
        cls.schema = _timed("table schema", cls.schema)  # type: ignore[method-assign]
        cls.committed_txid = _timed("table txid", cls.committed_txid)  # type: ignore[method-assign]
        cls.add = _timed("table add", cls.add)  # type: ignore[method-assign]
        for lookup in ("_newest_version_of", "versions"):  # how add finds its version
            if lookup in vars(cls):
                setattr(cls, lookup, _timed("table versions", getattr(cls, lookup)))


@contextmanager
def spent_in(into: dict[str, float]) -> Iterator[None]:
    before = dict(SPENT)
    yield
    for key, value in SPENT.items():
        into[key] = value - before.get(key, 0.0)


# -- the sides -----------------------------------------------------------------------------------


class PlainSide:
    """Spark writing the transform's output straight into a Parquet directory, one session."""

    label = "plain Spark Parquet"

    def __init__(self, connect_url: str, data: Path, out: Path, batch_rows: int) -> None:
        from pyspark.sql import SparkSession

        # Created inside run_size's keep_classic_mode(): PySpark's functions build Spark Connect
        # columns while the session's process-wide Connect mode marks are set.
        self.spark = SparkSession.builder.remote(connect_url).create()
        self.data, self.out, self.rows = data, out, batch_rows
        self.seconds: list[float] = []

    def step(self, b: int, *, timed: bool = True) -> None:
        from pyspark.sql import functions as F

        started = time.perf_counter()
        files = [str(batch_file(self.data, p, b)) for p in range(PARTITIONS)]
        batch = (
            self.spark.read.schema("offset long, line string, p string")
            .option("basePath", str(self.data))
            .parquet(*files)
        )
        frame = transform(batch).withColumn("txid", F.lit(b + 1).cast("long"))
        frame.write.mode("append").parquet(str(self.out))
        if timed:
            self.seconds.append(time.perf_counter() - started)

    def close(self) -> None:
        self.spark.stop()


class LakeSide:
    """This project's core loop into one lake sink: begin, process (Spark Connect), commit."""

    def __init__(
        self,
        kind: str,
        txlog: TransactionLog,
        connect_url: str,
        data: Path,
        workdir: Path,
        batch_rows: int,
        name: str,
    ) -> None:
        from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
        from airflow_txn_provider.sources.parquet import PartitionedParquetSource

        self.kind, self.log, self.name, self.rows = kind, txlog, name, batch_rows
        self.label = f"this project, {kind.capitalize()}"
        self.sink: LakeSink
        if kind == "delta":
            self.sink = DeltaSink(name, table_uri=str(workdir / "delta" / name), txid_column="txid")
        else:
            self.sink = IcebergSink(
                name,
                table=f"bench.{name}",
                warehouse=str(workdir / "warehouse"),
                txid_column="txid",
            )
        self.source = PartitionedParquetSource(
            str(data),
            max_per_partition=batch_rows // PARTITIONS,
        )
        txlog.register_pipeline(name, source_kind="transactional", max_pending=1)
        self.runner = SparkConnectRunner(JOB, url=connect_url)
        self.seconds: list[float] = []
        self.parts: dict[str, list[float]] = defaultdict(list)

    def step(self, b: int, *, timed: bool = True) -> None:
        from airflow_txn_provider.spark.job import BatchJob
        from airflow_txn_provider.transactions.commit import commit_registered

        run_spent: dict[str, float] = {}
        commit_spent: dict[str, float] = {}
        t0 = time.perf_counter()
        emission = self.log.begin_next(self.name, self.source)
        t1 = time.perf_counter()
        assert emission is not None and emission.emitted, emission
        attempt_no = emission.attempt
        assert attempt_no is not None
        job = BatchJob(self.name, emission.txid, attempt_no, self.source, sinks=(self.sink,))
        with spent_in(run_spent):
            outcome = self.runner.run(job, self.log)
        t2 = time.perf_counter()
        assert outcome.status == "processed", outcome
        with spent_in(commit_spent):
            result = commit_registered(self.log, self.name, emission.txid, attempt_no, [self.sink])
        t3 = time.perf_counter()
        assert result.applied and emission.txid == b + 1, (result, emission.txid, b)
        if not timed:
            return
        self.seconds.append(t3 - t0)
        attempt = next(
            a for a in self.log.attempts(self.name, emission.txid) if a.attempt == attempt_no
        )
        job_t = attempt.timings
        staged_check = run_spent.get("listing", 0.0) + run_spent.get("table schema", 0.0)
        spark = job_t.get("spark", 0.0) - staged_check
        table_commit = commit_spent.get("table commit", 0.0)
        add = commit_spent.get("table add", 0.0)
        lookups = commit_spent.get("table txid", 0.0) + commit_spent.get("table schema", 0.0)
        versions = commit_spent.get("table versions", 0.0)
        cleanup = commit_spent.get("cleanup", 0.0)
        parts = {
            "begin (begin_next: new offsets, log)": t1 - t0,
            "Spark Connect session": job_t.get("connect", 0.0),
            "Spark: read_batch, completeness, transform, Parquet write": spark,
            "listing the written files (names, sizes, footers)": run_spent.get("listing", 0.0),
            "table schema check at staging": run_spent.get("table schema", 0.0),
            "log: record the staged files": job_t.get("staging", 0.0),
            "processing, rest (log reads, session stop)": (t2 - t1)
            - sum(job_t.get(k, 0.0) for k in ("connect", "spark", "staging")),
            "commit: table commit (one Delta/Iceberg commit, lookups included)": table_commit,
            "… reading the table's txid and schema": lookups,
            "… adding the files (the table's commit)": add - versions,
            "… finding the new version (history)": versions,
            "commit: cleanup of other staging directories": cleanup,
            "commit: the log's own (Postgres)": (t3 - t2) - table_commit - cleanup,
            "**total (begin -> committed)**": t3 - t0,
        }
        for part, value in parts.items():
            self.parts[part].append(value)


# -- exactness -----------------------------------------------------------------------------------


def check_exact(
    data: Path, plain_dir: Path, lakes: list[LakeSide], log_url: str, batches: int
) -> int:
    """Every txid's rows equal in the plain output, each lake table and the ground truth; returns
    the rows checked per table."""
    from deltalake import DeltaTable

    plain = ds.dataset(str(plain_dir), format="parquet")
    readers: dict[str, Callable[[int], pa.Table]] = {"plain": plain_reader(plain)}
    totals = {"plain": plain.count_rows()}
    for side in lakes:
        table = side.sink.open(log_url)
        assert table.committed_txid(side.name) == batches, (side.name, batches)
        if side.kind == "delta":
            assert isinstance(side.sink, DeltaSink)
            delta = DeltaTable(side.sink.table_uri).to_pyarrow_dataset()
            readers[side.kind] = plain_reader(delta)
            totals[side.kind] = delta.count_rows()
        else:
            iceberg = table._table()  # type: ignore[attr-defined]
            readers[side.kind] = iceberg_reader(iceberg)
            totals[side.kind] = sum(task.file.record_count for task in iceberg.scan().plan_files())
    checked = 0
    for b in range(batches):
        truth = expected_rows(data, b)
        want = normalised(truth, truth.schema)
        for what, read in readers.items():
            got = normalised(read(b + 1), truth.schema)
            if not got.equals(want):
                raise AssertionError(
                    f"txid {b + 1}: {what} holds {got.num_rows} rows, not the {want.num_rows} "
                    "expected (or they differ)"
                )
        checked += truth.num_rows
    for what, total in totals.items():
        assert total == checked, f"{what} holds {total} rows in all, {checked} expected"
    return checked


def plain_reader(dataset: ds.Dataset) -> Callable[[int], pa.Table]:
    return lambda t: dataset.to_table(filter=pc.field("txid") == t)


def iceberg_reader(table: Any) -> Callable[[int], pa.Table]:
    return lambda t: table.scan(row_filter=f"txid == {t}").to_arrow()


# -- the run -------------------------------------------------------------------------------------


def rate(side: Any) -> float:
    return side.rows * len(side.seconds) / sum(side.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000:20,1000000:10", help="ROWS:BATCHES,...")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run of a few seconds ({QUICK_SIZES})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data and tables")
    parser.add_argument(
        "--connect-url",
        help="an already running Spark Connect server (sc://127.0.0.1:PORT) instead of one "
        "started here (the smoke test shares its session's)",
    )
    args = parser.parse_args(argv)
    sizes_arg = QUICK_SIZES if args.quick else args.sizes
    sizes = [tuple(int(float(x)) for x in s.split(":")) for s in sizes_arg.split(",")]
    for rows, batches in sizes:
        if rows % PARTITIONS or batches < 1:
            parser.error(f"batch rows must be a multiple of {PARTITIONS}, batches >= 1: {rows}")
    print(f"bench-lake: seed {args.seed}, sizes {sizes} (batch rows, batches)", flush=True)
    for noisy in ("airflow_txn_provider", "alembic", "pyiceberg"):  # a line per txid otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    workdir.chmod(0o755)
    instrument()
    load_start = os.getloadavg()[0]
    results: dict[int, dict[str, Any]] = {}
    try:
        datasets = {}
        for rows, batches in sizes:
            t0 = time.perf_counter()
            data = workdir / "data" / str(rows)
            write_dataset(data, rows, batches, args.seed + rows)
            datasets[rows] = (data, batches)
            print(f"  data {rows}: {rows * batches} rows in {time.perf_counter() - t0:.1f} s")
        with contextlib.ExitStack() as services:
            pg = services.enter_context(EmbeddedPostgres(durable=False))
            url = args.connect_url
            if not url:
                server = SparkConnectServer(workdir=workdir / "connect", conf=SPARK_CONF)
                url = services.enter_context(server).url
            txlog = TransactionLog.from_url(pg.url)
            for rows, (data, batches) in datasets.items():
                results[rows] = run_size(txlog, pg.url, url, workdir, data, rows, batches)
            txlog.engine.dispose()
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept: {workdir}")
    report(results, (load_start, os.getloadavg()[0]))
    return 0


def run_size(
    txlog: TransactionLog,
    log_url: str,
    connect_url: str,
    workdir: Path,
    data: Path,
    rows: int,
    batches: int,
) -> dict[str, Any]:
    print(f"{rows} rows x {batches} batches", flush=True)
    plain_dir = workdir / "plain" / str(rows)
    with keep_classic_mode(), contextlib.ExitStack() as closing:
        plain = PlainSide(connect_url, data, plain_dir, rows)
        closing.callback(plain.close)
        lakes = [
            LakeSide(kind, txlog, connect_url, data, workdir, rows, f"{kind}_{rows}")
            for kind in ("delta", "iceberg")
        ]
        # Warm-up: one throwaway batch per side (the first batch, into outputs of its own).
        warm_plain = PlainSide(connect_url, data, workdir / "plain-warm" / str(rows), rows)
        closing.callback(warm_plain.close)
        warm: list[PlainSide | LakeSide] = [
            warm_plain,
            *[
                LakeSide(
                    kind, txlog, connect_url, data, workdir / "warm", rows, f"warm_{kind}_{rows}"
                )
                for kind in ("delta", "iceberg")
            ],
        ]
        for side in warm:
            side.step(0, timed=False)
        sides: list[Any] = [plain, *lakes]
        for b in range(batches):
            shift = b % len(sides)
            for side in sides[shift:] + sides[:shift]:  # the order rotates: each goes first
                side.step(b)
            if sys.stdout.isatty():
                print(f"  batch {b + 1}/{batches}", end="\r", flush=True)
        if sys.stdout.isatty():
            print()
        # (closing: a session left open would retry its exit calls against a stopped server)
    t0 = time.perf_counter()
    checked = check_exact(data, plain_dir, lakes, log_url, batches)
    print(
        f"  exact: {checked} rows in each of plain Parquet, Delta, Iceberg = the input + chars, "
        f"every txid ({time.perf_counter() - t0:.1f} s to check)",
        flush=True,
    )
    return {"rows": rows, "batches": batches, "plain": plain, "lakes": lakes}


def pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def report(results: dict[int, dict[str, Any]], load: tuple[float, float]) -> None:
    print(
        f"\nbench-lake ({os.cpu_count()} cores, Spark Connect local[2], sides interleaved; "
        f"1-min load average {load[0]:.1f} at the start, {load[1]:.1f} at the end)"
    )
    print(
        "| batch rows | plain Spark Parquet rows/s (batch p50 / p95) | this project, Delta rows/s "
        "(txid p50 / p95) | this project, Iceberg rows/s (txid p50 / p95) | Delta / plain "
        "| Iceberg / plain |"
    )
    print("|---|---|---|---|---|---|")
    for rows, r in results.items():
        plain, (delta, iceberg) = r["plain"], r["lakes"]
        base = rate(plain)
        cells = [
            f"{rate(s):,.0f} ({pct(s.seconds, 50):.2f} / {pct(s.seconds, 95):.2f} s)"
            for s in (plain, delta, iceberg)
        ]
        print(
            f"| {rows:.0e} ({r['batches']} batches) | {' | '.join(cells)} "
            f"| **{rate(delta) / base:.2f}x** | **{rate(iceberg) / base:.2f}x** |"
        )
    print("\nwhere a txid's time goes (seconds, p50 per part; the parts' p50s need not add up)")
    heads = [f"{kind} {rows:.0e}" for rows in results for kind in ("Delta", "Iceberg")]
    print(f"| part | {' | '.join(heads)} |")
    print("|---|" + "---|" * len(heads))
    lakes = [side for r in results.values() for side in r["lakes"]]
    for part in lakes[0].parts:
        cells = [f"{statistics.median(side.parts[part]):.3f}" for side in lakes]
        print(f"| {part} | {' | '.join(cells)} |")
    plain_p50 = [f"{statistics.median(r['plain'].seconds):.3f}" for r in results.values()]
    cells = [cell for cell in plain_p50 for _ in (0, 1)]
    print(f"| plain Spark: read, transform, Parquet write (for reference) | {' | '.join(cells)} |")
    print()
    for rows, r in results.items():
        plain, (delta, iceberg) = r["plain"], r["lakes"]
        base, p50 = rate(plain), statistics.median(plain.seconds)
        print(
            f"ratio ours / plain, {rows:.0e} rows per batch: Delta {rate(delta) / base:.2f}x, "
            f"Iceberg {rate(iceberg) / base:.2f}x (goal >= 0.8x; from the p50s: Delta "
            f"{p50 / statistics.median(delta.seconds):.2f}x, Iceberg "
            f"{p50 / statistics.median(iceberg.seconds):.2f}x)"
        )


if __name__ == "__main__":
    sys.exit(main())
