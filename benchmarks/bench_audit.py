"""What the audit before publish costs a txid (issue 60): five expectations (three row conditions,
a row-count bound, a sigma bound on the count) checked over each txid's staged rows, side by side
with the same txids committed without them, in one run.

Run with ``make bench-audit``. Starts its own durable Postgres (fsync on) on 127.0.0.1. For each
size, two pipelines of one shape (a transactional map state keyed by ``sku``) take the same
batches, alternating which goes first: a first txid (not timed: caches), then ``--rounds`` txids
that update every key. One of the three conditions fails a few rows per txid (``warn``), so the
sample-key query runs too. A txid's time is its stage (the binary COPY of its rows) plus its
commit (audit, apply, committed mark: one database transaction), through ``commit_states`` as a
deployment runs it. The Spark job that computes the rows is left out, which can only make the
audit's share look larger. It prints the median seconds per txid of each and their ratio (the
goal: at most 1.10), and the audit's own median time as the commit recorded it (the attempt's
``audit`` timing) as a share of a txid without it, the same cost measured without the noise of
two 1e6-row commits. Exits 1 when the ratio misses the goal.

Usage: python benchmarks/bench_audit.py [--sizes 100000 1000000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from airflow_txn_provider.rules.expectations import (
    RowCondition,
    RowCount,
    RowCountWithinSigma,
)
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import MapState, StateKind
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

GOAL = 1.10


class Sequential(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def expectations(state: str) -> list:
    return [
        RowCondition(on=state, condition="delta >= 0", name="no returns"),  # a few fail: warn
        RowCondition(on=state, condition="sku LIKE 'k%'", action="drop", name="sku prefix"),
        RowCondition(on=state, condition="length(sku) <= 12", action="fail", name="sku length"),
        RowCount(on=state, min=1, action="fail", name="not empty"),
        RowCountWithinSigma(on=state, k=3, last=20, min_history=2, action="fail", name="sigma"),
    ]


def batch(n: int, txid: int) -> pa.Table:
    """``n`` keys, every txid the same ones; one row in 10 000 a return (negative)."""
    deltas = [-1 if (i + txid) % 10_000 == 0 else (i + txid) % 7 + 1 for i in range(n)]
    return pa.table({"sku": [f"k{i:09d}" for i in range(n)], "delta": pa.array(deltas, pa.int64())})


def txid_seconds(
    txlog: TransactionLog, pipeline: str, state: MapState, txid: int, rows: pa.Table, audit: list
) -> tuple[float, float]:
    """(stage + commit seconds, commit seconds) of one txid."""
    em = txlog.begin(pipeline, txid, Sequential())
    assert em.emitted and em.attempt is not None
    start = time.perf_counter()
    txlog.stage_output(
        pipeline,
        txid,
        em.attempt,
        lambda conn: {state.output_key: state.stage_arrow(conn, txid, em.attempt, rows)},
    )
    staged = time.perf_counter()
    assert commit_states(txlog, pipeline, txid, em.attempt, [state], expectations=audit).applied
    done = time.perf_counter()
    return done - start, done - staged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    worst = 0.0
    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url)
        print(f"Postgres on 127.0.0.1:{pg.port} (durable: fsync on); {args.rounds} rounds\n")
        header = (
            f"{'rows/txid':>10} {'with s':>8} {'without s':>10} {'ratio':>6} "
            f"{'commit with s':>14} {'commit without s':>17} {'audit s':>8} {'share':>6}"
        )
        print(header)
        print("-" * len(header))
        for n in args.sizes:
            runs = {}
            for label in ("with", "without"):
                pipeline = f"audit_{label}_{n}"
                txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
                name = f"a_{label}_{n}"
                state = MapState(pipeline, name, StateKind.TRANSACTIONAL, {"sku": "text"})
                audit = expectations(name) if label == "with" else []
                runs[label] = (pipeline, state.create(txlog.engine), audit)
            totals: dict[str, list[float]] = {"with": [], "without": []}
            commits: dict[str, list[float]] = {"with": [], "without": []}
            for txid in range(1, args.rounds + 2):
                rows = batch(n, txid)
                for label in ("with", "without") if txid % 2 else ("without", "with"):
                    pipeline, state, audit = runs[label]
                    total, commit = txid_seconds(txlog, pipeline, state, txid, rows, audit)
                    if txid > 1:
                        totals[label].append(total)
                        commits[label].append(commit)
            audited = [txlog.attempts(runs["with"][0], t)[-1] for t in range(2, args.rounds + 2)]
            audit_s = statistics.median(a.timings["audit"] for a in audited)
            outcomes = audited[-1].expectations
            taken = {o["expectation"]: o["taken"] for o in outcomes}
            assert taken["no returns"] == "warned" and taken["sigma"] == "passed", taken
            with_s, without_s = (statistics.median(totals[k]) for k in ("with", "without"))
            ratio = with_s / without_s
            worst = max(worst, ratio)
            c_with, c_without = (statistics.median(commits[k]) for k in ("with", "without"))
            print(
                f"{n:>10} {with_s:>8.3f} {without_s:>10.3f} {ratio:>5.2f}x "
                f"{c_with:>14.3f} {c_without:>17.3f} {audit_s:>8.3f} {audit_s / without_s:>6.1%}"
            )
    print(f"\nworst median ratio: {worst:.2f}x (goal: at most {GOAL:.2f}x)")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
