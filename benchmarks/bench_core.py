"""Transaction-core benchmark: state commit throughput vs raw COPY, and log-operation latency.

Run with ``make bench-core``. Starts its own durable Postgres (fsync on) on 127.0.0.1 and prints:

1. for 1e5 and 1e6 distinct keys and each state kind, the rate of a *state commit* (stage the batch
   with one binary COPY into the UNLOGGED staging table, its rows checked against the value
   domain first, then apply it with one upsert and mark the txid committed in the same
   transaction), for a first batch (every key new: inserts) and a second batch (every key
   present: updates), side by side with a raw binary COPY of the same rows into an UNLOGGED
   table measured in the same run;
2. median and p95 latency of the log's begin, mark-processed and commit operations.

Usage: python benchmarks/bench_core.py [--sizes 100000 1000000] [--ops 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import text

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import MapState, StateKind
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402


class Sequential(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"batch": txid}


def make_rows(n: int) -> list[tuple[str, int]]:
    return [(f"key{i:08d}", 1) for i in range(n)]


def raw_copy_seconds(txlog: TransactionLog, rows: list[tuple[str, int]]) -> float:
    with txlog.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_raw"))
        conn.execute(text("CREATE UNLOGGED TABLE bench_raw (word text, delta bigint)"))
    with txlog.engine.begin() as conn, conn.connection.driver_connection.cursor() as cur:
        start = time.perf_counter()
        with cur.copy("COPY bench_raw (word, delta) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "int8"])
            for row in rows:
                copy.write_row(row)
        elapsed = time.perf_counter() - start
    return elapsed


def state_commit_seconds(
    txlog: TransactionLog, pipeline: str, state: MapState, txid: int, rows: list[tuple[str, int]]
) -> tuple[float, float]:
    """(stage seconds, apply+commit seconds) of one batch through the real log and state."""
    em = txlog.begin(pipeline, txid, Sequential())
    assert em.emitted and em.attempt is not None
    start = time.perf_counter()

    def stage(conn):
        return {state.output_key: state.stage(conn, txid, em.attempt, rows)}

    txlog.stage_output(pipeline, txid, em.attempt, stage)
    staged = time.perf_counter()
    expected = txlog.view(pipeline).record(txid).output[state.output_key]
    txlog.commit(
        pipeline,
        txid,
        em.attempt,
        lambda conn, rec: {
            "keys": state.apply(conn, txid, em.attempt, expected_rows=expected).keys
        },
    )
    done = time.perf_counter()
    return staged - start, done - staged


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--ops", type=int, default=300, help="txids for the latency figures")
    args = parser.parse_args(argv)

    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url)
        print(f"Postgres on 127.0.0.1:{pg.port} (durable: fsync on)\n")
        print(
            "State commit throughput (stage: checks + binary COPY; one upsert + committed mark; "
            "one DB tx each)"
        )
        header = (
            f"{'keys':>9} {'kind':<18} {'batch':<8} {'stage s':>8} {'apply s':>8} "
            f"{'total s':>8} {'keys/s':>11} {'raw COPY/s':>11} {'ratio':>6}"
        )
        print(header)
        print("-" * len(header))
        for n in args.sizes:
            payload = make_rows(n)
            for kind in StateKind:
                name = f"b{n}_{kind.value}"[:40]
                pipeline = f"bench_{name}"
                txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
                state = MapState(pipeline, name, kind, keys={"word": "text"}).create(txlog.engine)
                for txid, label in ((1, "inserts"), (2, "updates")):
                    raw = raw_copy_seconds(txlog, payload)  # same run, same data, right beside it
                    stage_s, apply_s = state_commit_seconds(txlog, pipeline, state, txid, payload)
                    total = stage_s + apply_s
                    print(
                        f"{n:>9} {kind.value:<18} {label:<8} {stage_s:>8.2f} {apply_s:>8.2f} "
                        f"{total:>8.2f} {n / total:>11,.0f} {n / raw:>11,.0f} "
                        f"{raw / total:>6.0%}"
                    )
                with txlog.engine.begin() as conn:
                    conn.execute(text(f"DROP TABLE {state.table}"))
                    conn.execute(text(f"DROP TABLE {state.stage_table}"))
                    conn.execute(text(f"DROP TABLE {state.backing.qundo}"))
                    conn.execute(
                        text("DELETE FROM txn_state_registry WHERE name = :n"), {"n": name}
                    )

        print(f"\nLog operation latency over {args.ops} txids (max_pending=4, durable commits)")
        txlog.register_pipeline("bench_latency", source_kind="transactional", max_pending=4)
        begin_ms, processed_ms, commit_ms = [], [], []
        src = Sequential()
        for txid in range(1, args.ops + 1):
            t0 = time.perf_counter()
            em = txlog.begin("bench_latency", txid, src)
            t1 = time.perf_counter()
            txlog.mark_processed("bench_latency", txid, em.attempt, {"rows": 1})
            t2 = time.perf_counter()
            txlog.commit("bench_latency", txid, em.attempt)
            t3 = time.perf_counter()
            begin_ms.append((t1 - t0) * 1e3)
            processed_ms.append((t2 - t1) * 1e3)
            commit_ms.append((t3 - t2) * 1e3)
        print(f"{'operation':<16} {'p50 ms':>8} {'p95 ms':>8}")
        for label, values in (
            ("begin", begin_ms),
            ("mark_processed", processed_ms),
            ("commit", commit_ms),
        ):
            print(f"{label:<16} {statistics.median(values):>8.2f} {percentile(values, 0.95):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
