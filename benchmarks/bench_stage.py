"""Staging benchmark: the binary COPY path against the text CSV path it replaced, on the same rows.

Run with ``make bench-stage``. Starts its own Postgres on 127.0.0.1 and, for each size, stages
the same Arrow table (a text key, a bigint delta: what a word count's Spark job hands over) into
a state's UNLOGGED staging table two ways, each in its own database transaction, alternating,
``--repeat`` times, and prints the median rows/s of each and their ratio:

* **csv (before)**: what ``MapState.stage_arrow`` did until issue 25: pyarrow writes the table
  as CSV text, psycopg2's ``copy_expert`` streams it into ``COPY … (FORMAT csv)`` through a
  universal-newline text reader (which turned a carriage return in a key into a line feed);
* **binary (now)**: ``MapState.stage_arrow`` as it is: the value domain checked by Arrow's
  kernels, the table encoded in Postgres's binary COPY format by numpy from Arrow's buffers, one
  binary ``COPY`` by psycopg 3 on the log's own connection.

It also stages keys with a carriage return both ways and prints how many came back as given.

Usage: python benchmarks/bench_stage.py [--sizes 100000 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
from sqlalchemy import text

from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402


def make_table(n: int, suffix: str = "") -> pa.Table:
    return pa.table(
        {
            "word": [f"word{i % 50_000:05d}-{i}{suffix}" for i in range(n)],
            "delta": pa.array([1 + i % 7 for i in range(n)], pa.int64()),
        }
    )


def stage_csv_before(pg: EmbeddedPostgres, state: MapState, table: pa.Table) -> float:
    """The text path as it was (``MapState.stage_arrow`` and ``stage_csv`` before issue 25, on
    psycopg2): null checks, pyarrow CSV, the job's earlier rows deleted, ``copy_expert``."""
    import psycopg2
    import pyarrow.compute as pc

    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres")
    try:
        with conn, conn.cursor() as cur:
            start = time.perf_counter()
            for column in ("word", "delta"):
                pc.index(pc.is_null(table.column(column)), True).as_py()
            buf = io.BytesIO()
            pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False))
            buf.seek(0)
            cur.execute(
                f"DELETE FROM {state.stage_table} WHERE txid = 2 AND attempt = 1 AND stage_job = ''"
            )
            for name, value in (("txid", "2"), ("attempt", "1"), ("job", "")):
                cur.execute(f"SELECT set_config('txn.stage_{name}', %s, true)", (value,))
            cur.copy_expert(
                f"COPY {state.stage_table} (word, delta) FROM STDIN "
                "WITH (FORMAT csv, FORCE_NOT_NULL (word, delta))",
                io.TextIOWrapper(buf, encoding="utf-8"),
            )
            return time.perf_counter() - start
    finally:
        conn.close()


def stage_binary_now(txlog: TransactionLog, state: MapState, table: pa.Table) -> float:
    with txlog.engine.begin() as conn:
        start = time.perf_counter()
        state.stage_arrow(conn, 1, 1, table)
        return time.perf_counter() - start


def clear(txlog: TransactionLog, state: MapState) -> None:
    with txlog.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {state.stage_table}"))


def exact_keys(txlog: TransactionLog, state: MapState, txid: int, table: pa.Table) -> int:
    with txlog.engine.connect() as conn:
        stored = {w for w, _ in state.staged(conn, txid, 1)}
    return sum(1 for w in table.column("word").to_pylist() if w in stored)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url)
        state = MapState("bench_stage", "bench_stage", keys={"word": "text"}).create(txlog.engine)
        print(f"Postgres on 127.0.0.1:{pg.port}; medians of {args.repeat} runs each\n")
        header = f"{'rows':>9} {'csv (before) rows/s':>20} {'binary (now) rows/s':>20} {'ratio':>6}"
        print(header)
        print("-" * len(header))
        for n in args.sizes:
            table = make_table(n)
            csv_s, binary_s = [], []
            for _ in range(args.repeat):
                clear(txlog, state)
                csv_s.append(stage_csv_before(pg, state, table))
                clear(txlog, state)
                binary_s.append(stage_binary_now(txlog, state, table))
            csv_rate = n / statistics.median(csv_s)
            binary_rate = n / statistics.median(binary_s)
            print(
                f"{n:>9} {csv_rate:>20,.0f} {binary_rate:>20,.0f} {binary_rate / csv_rate:>5.2f}x"
            )
        crlf = make_table(1000, suffix="\r")
        clear(txlog, state)
        stage_csv_before(pg, state, crlf)
        before = exact_keys(txlog, state, 2, crlf)
        clear(txlog, state)
        stage_binary_now(txlog, state, crlf)
        now = exact_keys(txlog, state, 1, crlf)
        print(
            f"\nkeys ending in a carriage return stored as given, of 1000: csv (before) {before}, "
            f"binary (now) {now}"
        )
        txlog.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
