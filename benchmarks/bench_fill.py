"""Filling an output from history vs the live pipeline's processing, side by side (issue 44).

Run with ``make bench-fill``. Starts its own Postgres and Spark Connect server (``local[2]``), on
127.0.0.1, and generates a Parquet dataset (2 partitions, ``--lines`` lines per partition per txid,
one file each, words from a seeded generator: the seed is printed). Then, in one run:

1. **The live pipeline** (the peer): pipeline ``fill_bench`` counts words (state ``counts``,
   ``spark_jobs/word_count.py``'s transform); ``--history`` txids (1 000 by default) go through
   the core loop one after another, as a pipeline with one txid in flight does: ``begin_next`` ->
   ``process_batch`` on a Spark Connect session -> ``commit_registered``. Its rows/s are the
   lines it processed over the loop's wall time; its commit latency is ``commit_registered``'s.
2. **The fill**: the declaration adds ``counts_again``, the same transform under another name,
   with ``start="history"``; ``fill_pipeline`` (the fill DAG's task, without Airflow) computes it
   over every committed txid in chunks of ``--chunk`` on its own session, while the live loop
   goes on committing new txids in a thread. The fill's rows/s are the lines of the txids it
   computed over its wall time, to its join.
3. Printed: both rows/s and their ratio (goal: fill >= 0.8x live), the live commit latency's p50
   and p95 without the fill (the last 200 txids of step 1) and during it (goal: p50 within 1.5x),
   and the load average. Checked exact at the end: after the join and a few more live txids,
   ``counts_again`` equals ``counts`` row for row, bookkeeping columns included (the same
   transform over the same committed batches), and both equal the word counts computed in plain
   Python over the committed txids' lines. Exits non-zero when a goal or the check fails.

Usage: python benchmarks/bench_fill.py [--history 1000] [--lines 100] [--chunk 25] [--seed 44]
    [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import text

from airflow_txn_provider.operators.spark_runner import load_job_module
from airflow_txn_provider.rules.names import quote_ident
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.fill import fill_pipeline
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing and tests
from tests.spark_data import append_parquet  # noqa: E402
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402
from txn_testing.spark import SparkConnectServer  # noqa: E402

PIPELINE = "fill_bench"
WORD_COUNT = load_job_module(ROOT / "spark_jobs" / "word_count.py").transform
PARTITIONS = ("0", "1")
VOCABULARY = [f"w{i}" for i in range(500)]


def lines_of(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(VOCABULARY, k=6)) for _ in range(count)]


def live_only(batch):
    return {"counts": WORD_COUNT(batch)}


def live_and_new(batch):
    counted = WORD_COUNT(batch)
    return {"counts": counted, "counts_again": counted}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Live:
    """The live loop: one txid at a time, its lines, processing and commit seconds recorded."""

    def __init__(self, txlog: TransactionLog, spark, source, per_txid: int) -> None:
        self.txlog, self.spark, self.source, self.per_txid = txlog, spark, source, per_txid
        self.commits: list[tuple[int, float]] = []  # (txid, commit seconds)
        self.lines = 0

    def one(self, transform) -> bool:
        e = self.txlog.begin_next(PIPELINE, self.source)
        if e is None or not e.emitted:
            return False
        process_batch(
            self.spark, self.txlog, BatchJob(PIPELINE, e.txid, e.attempt, self.source), transform
        )
        started = time.perf_counter()
        assert commit_registered(self.txlog, PIPELINE, e.txid, e.attempt).applied
        self.commits.append((e.txid, time.perf_counter() - started))
        self.lines += sum(b - a for a, b in e.metadata.values())
        return True


def table(txlog: TransactionLog, name: str) -> list[tuple]:
    with txlog.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT * FROM {quote_ident('txn_state_' + name)} ORDER BY 1"))
        return [tuple(r) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1000, help="committed txids to fill")
    parser.add_argument("--lines", type=int, default=100, help="lines per partition per txid")
    parser.add_argument("--chunk", type=int, default=25, help="txids per fill job")
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument(
        "--live-every", type=float, default=0.5, help="seconds between live txids during the fill"
    )
    parser.add_argument("--quick", action="store_true", help="60 txids: a smoke run")
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.WARNING)  # the figures, not every txid's log lines
    if args.quick:
        args.history = 60
    baseline = min(200, args.history // 2)
    spare = max(400, args.history // 2)  # txids of data the live loop may take during the fill
    print(
        f"seed {args.seed}; history {args.history} txids of {len(PARTITIONS)} x {args.lines} "
        f"lines; fill chunk {args.chunk}; load average {os.getloadavg()}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="txn-bench-fill-") as tmp,
        EmbeddedPostgres(durable=False) as pg,
        SparkConnectServer(workdir=Path(tmp) / "connect") as server,
    ):
        data = Path(tmp) / "data"
        every: dict[str, list[str]] = {}
        for i, p in enumerate(PARTITIONS):
            every[p] = lines_of(args.seed + i, (args.history + spare) * args.lines)
            append_parquet(data, p, every[p], file_rows=args.lines)
        source = PartitionedParquetSource(str(data), args.lines)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"
        txlog = TransactionLog.from_url(url)
        counts = MapState(PIPELINE, "counts", "transactional", keys={"word": "text"})
        again = MapState(PIPELINE, "counts_again", "transactional", keys={"word": "text"})
        txlog.ensure_pipeline(PIPELINE, source_kind="transactional", max_pending=2, states=[counts])
        from pyspark.sql import SparkSession

        # remote sessions only: this process stays in Spark Connect mode
        live_spark = SparkSession.builder.remote(server.url).create()
        fill_spark = SparkSession.builder.remote(server.url).create()
        live = Live(txlog, live_spark, source, args.lines * len(PARTITIONS))
        live.one(live_only)  # warm-up: the JIT, the first session's plans
        started = time.perf_counter()
        while len(live.commits) < args.history:
            live.one(live_only)
        live_seconds = time.perf_counter() - started
        live_rate = (live.lines - args.lines * len(PARTITIONS)) / live_seconds
        before = [s for _, s in live.commits[-baseline:]]
        print(f"live: {args.history} txids in {live_seconds:.1f} s, {live_rate:,.0f} lines/s")

        txlog.ensure_pipeline(
            PIPELINE,
            source_kind="transactional",
            max_pending=2,
            states=[counts, again],
            start={"counts_again": "history"},
        )
        first_live = txlog.last_committed(PIPELINE) + 1
        stop = threading.Event()

        def keep_committing() -> None:  # a txid every --live-every seconds, as data arrives
            while not stop.is_set():
                due = time.perf_counter() + args.live_every
                live.one(live_and_new)
                stop.wait(max(0.0, due - time.perf_counter()))

        thread = threading.Thread(target=keep_committing, daemon=True)
        thread.start()
        started = time.perf_counter()
        report = fill_pipeline(
            txlog,
            PIPELINE,
            spark=fill_spark,
            source=source,
            transforms=[live_and_new],
            chunk=args.chunk,
            on_progress=lambda line: None,
        )
        fill_seconds = time.perf_counter() - started
        stop.set()
        thread.join()
        joined = report.joined_after["counts_again"]
        during = [s for t, s in live.commits if first_live <= t <= joined]
        computed = report.computed["counts_again"]
        fill_rate = computed * args.lines * len(PARTITIONS) / fill_seconds
        for _ in range(3):  # after the join: the live commits apply both
            live.one(live_and_new)
        last = txlog.last_committed(PIPELINE)

        truth = Counter()
        for p in PARTITIONS:
            for line in every[p][: last * args.lines]:
                truth.update(line.split())
        mine, other = table(txlog, "counts_again"), table(txlog, "counts")
        exact = mine == other and {r[0]: r[1] for r in mine} == dict(truth)
        live_spark.stop()
        fill_spark.stop()

    ratio = fill_rate / live_rate
    latency = statistics.median(during) / statistics.median(before) if during else float("nan")
    print(
        f"fill: {computed} txids computed, {report.applied_staged.get('counts_again', 0)} "
        f"applied from staged rows, joined after txid {joined}, in {fill_seconds:.1f} s"
    )
    print(f"{'':28}{'lines/s':>12}")
    print(f"{'live processing (peer)':28}{live_rate:>12,.0f}")
    print(f"{'fill from history':28}{fill_rate:>12,.0f}")
    print(f"fill / live: {ratio:.2f}x (goal >= 0.8x)")
    print(
        f"live commit latency, p50 / p95 ms: without the fill {1000 * pct(before, 0.5):.1f} / "
        f"{1000 * pct(before, 0.95):.1f} ({len(before)} txids); during it "
        + (
            f"{1000 * pct(during, 0.5):.1f} / {1000 * pct(during, 0.95):.1f} ({len(during)} "
            f"txids): {latency:.2f}x (goal <= 1.5x)"
            if during
            else "(no live commit)"
        )
    )
    print(
        f"exact: counts_again == counts == plain Python's word counts over txids 1..{last}: "
        f"{exact}; load average {os.getloadavg()}"
    )
    ok = exact and ratio >= 0.8 and (not during or latency <= 1.5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
