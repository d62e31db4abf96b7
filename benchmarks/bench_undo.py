"""What a rewind costs each commit: the apply and commit of a batch with the undo records its
statement writes (every state, since rewind to txid N), side by side with the same commit
without them, in one run.

Run with ``make bench-undo``. Starts its own durable Postgres (fsync on) on 127.0.0.1. For each
size and state kind, two states of one shape take the same batches, the two alternating (which
goes first too): after a first batch (not timed: the first commit of each state pays for its
caches), ``--rounds`` txids that update every key of it ("updates"), ``--rounds`` txids of new
keys only ("inserts"), and ``--rounds`` txids whose keys slide by half a batch each time (half
updates, half new keys: "mixed"). It prints the median apply+commit seconds of each, and their
ratio; the goal (issue 29) is at most 1.10x.

Usage: python benchmarks/bench_undo.py [--sizes 10000 100000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from bench_core import state_commit_seconds

from airflow_txn_provider.state import MapState, StateKind
from airflow_txn_provider.state.backing import BackingTable
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402


@dataclasses.dataclass(frozen=True, eq=False)
class WithoutUndo(MapState):
    """The same state, its apply statement without the undo CTE (the baseline)."""

    @property
    def backing(self) -> BackingTable:
        return dataclasses.replace(super().backing, undo=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    kinds = (StateKind.TRANSACTIONAL, StateKind.OPAQUE)
    with EmbeddedPostgres(durable=True) as pg:
        txlog = TransactionLog.from_url(pg.url)
        print(f"Postgres on 127.0.0.1:{pg.port} (durable: fsync on); {args.rounds} rounds\n")
        header = (
            f"{'keys':>8} {'kind':<14} {'batch':<8} {'with undo s':>12} {'without s':>10} "
            f"{'ratio':>6}"
        )
        print(header)
        print("-" * len(header))
        worst = 0.0
        for n in args.sizes:
            for kind in kinds:
                states = {}
                for label, cls in (("with", MapState), ("without", WithoutUndo)):
                    pipeline = f"undo_{label}_{n}_{kind.value}"
                    txlog.register_pipeline(pipeline, source_kind="transactional", max_pending=2)
                    state = cls(
                        pipeline, f"s_{label}_{n}_{kind.value}"[:40], kind, {"word": "text"}
                    )
                    states[label] = (pipeline, state.create(txlog.engine))
                times: dict[str, dict[str, list[float]]] = {"with": {}, "without": {}}
                rounds = range(1, args.rounds + 1)
                plan = [("warm-up", 0)] + [("updates", 0)] * args.rounds
                plan += [("inserts", r * n) for r in rounds]
                plan += [("mixed", args.rounds * n + r * n // 2) for r in rounds]
                for txid, (batch, first_key) in enumerate(plan, start=1):
                    rows = [(f"key{i:08d}", 1) for i in range(first_key, first_key + n)]
                    order = ("with", "without") if txid % 2 else ("without", "with")
                    for label in order:
                        pipeline, state = states[label]
                        _stage, apply_s = state_commit_seconds(txlog, pipeline, state, txid, rows)
                        times[label].setdefault(batch, []).append(apply_s)
                for batch in ("inserts", "updates", "mixed"):
                    with_s = statistics.median(times["with"][batch])
                    without_s = statistics.median(times["without"][batch])
                    ratio = with_s / without_s
                    worst = max(worst, ratio)
                    print(
                        f"{n:>8} {kind.value:<14} {batch:<8} {with_s:>12.3f} {without_s:>10.3f} "
                        f"{ratio:>5.2f}x"
                    )
        print(f"\nworst median ratio: {worst:.2f}x (goal: at most 1.10x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
