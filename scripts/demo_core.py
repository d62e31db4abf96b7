"""Core demo: ordered batch transactions on an embedded Postgres, no Airflow or Spark yet.

Runs Storm's TransactionalWords idea: each txid's batch is a deterministic slice of a generated
corpus (a transactional source); up to ``max_pending`` txids are emitted and processed at once
(threads stand in for Spark jobs), the first attempt of one txid fails (so it and every later
in-flight txid replay with new attempts), and commits apply word counts and a global total in txid
order, each in one Postgres transaction with its "committed" mark.

The Postgres cluster lives in ``var/pg`` and survives: a second run continues from the log.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.state import GlobalState, MapState, stage_states
from airflow_txn_provider.transactions.commit import commit_states
from airflow_txn_provider.transactions.transaction_log import TransactionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's txn_testing
from txn_testing.postgres import EmbeddedPostgres  # noqa: E402

PIPELINE = "demo_words"
VOCABULARY = "the cow jumped over moon man went to store four score and seven years ago".split()


def batch_words(txid: int, size: int = 40) -> list[str]:
    rng = random.Random(txid)  # the same txid always reads the same batch
    return [rng.choice(VOCABULARY) for _ in range(size)]


class CorpusSource(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"seed": txid, "size": 40}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="core demo of ordered batch transactions")
    parser.add_argument("--txids", type=int, default=8, help="txids to commit in this run")
    parser.add_argument("--max-pending", type=int, default=3)
    parser.add_argument("--datadir", type=Path, default=Path("var/pg"))
    parser.add_argument("--port", type=int, default=54329)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)

    with EmbeddedPostgres(datadir=args.datadir.resolve(), port=args.port) as pg:
        txlog = TransactionLog.from_url(pg.url)
        txlog.register_pipeline(PIPELINE, source_kind="transactional", max_pending=args.max_pending)
        words = MapState(PIPELINE, "demo_word_counts", "transactional", keys={"word": "text"})
        total = GlobalState(PIPELINE, "demo_total", "opaque")
        for state in (words, total):
            state.create(txlog.engine)
        txlog.recover(PIPELINE)  # a previous run may have stopped mid-flight
        source = CorpusSource()
        start = txlog.last_committed(PIPELINE)
        goal = start + args.txids
        fail_once = start + 2  # inject one failure per run

        def process(txid: int, attempt: int, metadata: dict) -> None:
            counts = Counter(batch_words(metadata["seed"], metadata["size"]))
            if txid == fail_once and attempt == 1:
                txlog.fail(PIPELINE, txid, attempt, error="injected failure (demo)")
                return
            txlog.stage_output(
                PIPELINE,
                txid,
                attempt,
                lambda conn: stage_states(
                    conn, txid, attempt, {words: counts.items(), total: [(metadata["size"],)]}
                ),
            )

        with ThreadPoolExecutor(max_workers=args.max_pending) as pool:
            while txlog.last_committed(PIPELINE) < goal:
                # Begin the whole wave before processing any of it, as the coordinator emits a
                # batch per free slot: the injected failure then always finds later txids in
                # flight, so the cascade the demo shows does not depend on thread timing.
                wave = []
                while (em := txlog.begin_next(PIPELINE, source)) is not None and em.emitted:
                    if em.txid > goal:
                        txlog.fail(PIPELINE, em.txid, em.attempt, error="beyond this run's goal")
                        break
                    wave.append(em)
                futures = [pool.submit(process, em.txid, em.attempt, em.metadata) for em in wave]
                for f in futures:
                    f.result()
                view = txlog.view(PIPELINE)
                for rec in view.in_flight:
                    if rec.txid != txlog.last_committed(PIPELINE) + 1:
                        break
                    if rec.status.value != "processed":
                        break
                    commit_states(txlog, PIPELINE, rec.txid, rec.attempt, [words, total])

        print(f"\n{'txid':>5} {'attempt':>7} {'status':<10} last error")
        for tx in txlog.transactions(PIPELINE, since_txid=max(0, start - 2)):
            print(f"{tx.txid:>5} {tx.attempt:>7} {tx.status.value:<10} {tx.last_error or ''}")
        with txlog.engine.connect() as conn:
            top = sorted(words.items(conn).items(), key=lambda kv: -kv[1])[:5]
            print(
                f"\ncommitted txids: {txlog.last_committed(PIPELINE)}; "
                f"total words: {total.value(conn)}"
            )
            print("top words:", ", ".join(f"{k[0]}={v}" for k, v in top))
        expected = sum(40 for _ in range(txlog.last_committed(PIPELINE)))
        with txlog.engine.connect() as conn:
            assert total.value(conn) == expected, "exactly-once violated"
        print(f"exactly once: total == 40 x committed txids == {expected}")
        txlog.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
