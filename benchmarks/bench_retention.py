"""Retention benchmark: the log's size and the Transactions page's state read, with and without
retention, over a long pipeline.

Run with ``make bench-retention``. Starts its own durable Postgres (fsync on) on 127.0.0.1 and
runs the same pipeline twice, each in a database of its own, side by side: once with the default
retention (``keep_txids=1000``) and once without (``keep_txids`` larger than the run). Each txid
goes through the real transaction log (begin, stage into a MapState with COPY, mark processed,
commit); each adds ``--new-keys`` keys to the state and updates as many existing ones, so the state
grows as a real one does. At each checkpoint it prints:

* rows and ``pg_total_relation_size`` of ``txn_transaction`` and ``txn_attempt``;
* the median commit time of the last segment (retention runs inside the commit);
* the state summary the page shows (key count, sum, top 10), read as the page reads it now
  (the summary row the commits keep + the top keys, a scan up to 100 000 keys and at most every
  30 s above: ``page ms``) and as it was read before
  (``count(*)``/``sum`` over the whole table: ``scan ms``), both the median of 5 reads.

Usage: python benchmarks/bench_retention.py [--txids 10000] [--points 1000 5000 10000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import create_engine, text

from airflow_txn_provider.rules.sources import OpaqueSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import reader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

PIPELINE = "bench_retention"


class Offsets(OpaqueSource):
    def initialize_transaction(self, txid, prev):
        start = prev["end"] if prev else 0
        return {"start": start, "end": start + 100}


def ms(seconds: float) -> float:
    return seconds * 1e3


def median_ms(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return ms(statistics.median(times))


def table_figures(txlog: TransactionLog) -> dict[str, tuple[int, int]]:
    with txlog.engine.connect() as conn:
        return {
            table: (
                int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()),
                int(
                    conn.execute(
                        text("SELECT pg_total_relation_size(:t)"), {"t": table}
                    ).scalar_one()
                ),
            )
            for table in ("txn_transaction", "txn_attempt")
        }


def run(
    url: str, label: str, keep: int, txids: int, points: Sequence[int], new_keys: int
) -> list[str]:
    txlog = TransactionLog.from_url(url)
    state = MapState(PIPELINE, "bench_words", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline(
        PIPELINE, source_kind="opaque", max_pending=4, states=[state], keep_txids=keep
    )
    src = Offsets()
    lines = []
    commit_s: list[float] = []
    for txid in range(1, txids + 1):
        em = txlog.begin(PIPELINE, txid, src)
        base = (txid - 1) * new_keys
        rows = [(f"k{base + i:09d}", i % 7 + 1) for i in range(new_keys)]  # new keys
        rows += [(f"k{(base * 7 + i * 13) % max(base, 1):09d}", 1) for i in range(new_keys)]
        batch: dict[str, int] = {}
        for word, delta in rows:
            batch[word] = batch.get(word, 0) + delta
        with txlog.engine.begin() as conn:
            staged = state.stage(conn, txid, em.attempt, list(batch.items()))
        txlog.mark_processed(PIPELINE, txid, em.attempt, {state.output_key: staged})
        t0 = time.perf_counter()
        commit_states(txlog, PIPELINE, txid, em.attempt, [state])
        commit_s.append(time.perf_counter() - t0)
        if txid in points:
            figures = table_figures(txlog)
            page = median_ms(lambda: reader.state_summaries(txlog.engine, PIPELINE))

            def scan(table: str = state.table) -> None:
                with txlog.engine.connect() as conn:
                    conn.execute(text(f"SELECT count(*), sum(value) FROM {table}")).one()

            scan_ms = median_ms(scan)
            with txlog.engine.connect() as conn:
                keys = int(conn.execute(text(f"SELECT count(*) FROM {state.table}")).scalar_one())
            tx_rows, tx_bytes = figures["txn_transaction"]
            at_rows, at_bytes = figures["txn_attempt"]
            lines.append(
                f"{label:<13} {txid:>7} {tx_rows:>9} {tx_bytes / 1024:>9.0f} {at_rows:>9} "
                f"{at_bytes / 1024:>9.0f} {ms(statistics.median(commit_s)):>9.2f} "
                f"{keys:>9} {page:>8.2f} {scan_ms:>8.2f}"
            )
            print(lines[-1], flush=True)
            commit_s = []
    txlog.engine.dispose()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txids", type=int, default=10_000)
    parser.add_argument("--points", type=int, nargs="+", default=[1000, 5000, 10_000])
    parser.add_argument("--keep", type=int, default=1000, help="keep_txids with retention")
    parser.add_argument("--new-keys", type=int, default=20, help="new state keys per txid")
    args = parser.parse_args(argv)
    for noisy in ("airflow_txn_provider", "alembic"):  # not a line per txid
        logging.getLogger(noisy).setLevel(logging.WARNING)
    points = sorted(p for p in args.points if p <= args.txids)

    with EmbeddedPostgres(durable=True) as pg:
        admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for db in ("bench_keep", "bench_all"):
                conn.execute(text(f"CREATE DATABASE {db}"))
        admin.dispose()
        base = pg.url.rsplit("/", 1)[0]
        print(f"Postgres on 127.0.0.1:{pg.port} (durable: fsync on); {args.txids} txids, ")
        print(f"{args.new_keys} new + {args.new_keys} updated state keys per txid, max_pending 4\n")
        header = (
            f"{'retention':<13} {'txids':>7} {'txn rows':>9} {'txn KiB':>9} {'att rows':>9} "
            f"{'att KiB':>9} {'commit ms':>9} {'keys':>9} {'page ms':>8} {'scan ms':>8}"
        )
        print(header)
        print("-" * len(header))
        kept = run(
            f"{base}/bench_keep", f"keep {args.keep}", args.keep, args.txids, points, args.new_keys
        )
        everything = run(f"{base}/bench_all", "none", 2**31 - 1, args.txids, points, args.new_keys)
        print("\nSide by side")
        print(header)
        print("-" * len(header))
        for a, b in zip(kept, everything, strict=True):
            print(a)
            print(b)
    return 0


if __name__ == "__main__":
    sys.exit(main())
