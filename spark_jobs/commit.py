"""Commit one txid: apply its staged results to every state of the pipeline and mark it committed,
in one Postgres transaction (no Spark needed: the results were staged by the processing job).

    TXN_LOG_URL=postgresql://… python spark_jobs/commit.py --pipeline P --txid 3 --attempt 1

The Airflow commit operator calls the same function in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from airflow_txn_provider.rules.exceptions import TxnError
from airflow_txn_provider.spark.job import LOG_URL_ENV
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--txid", required=True, type=int)
    parser.add_argument("--attempt", required=True, type=int)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    url = os.environ.get(LOG_URL_ENV)
    if not url:
        print(f"error: ${LOG_URL_ENV} is not set", file=sys.stderr)
        return 2
    log = TransactionLog.from_url(url, migrate=False)
    try:
        result = commit_registered(log, args.pipeline, args.txid, args.attempt)
    except TxnError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        log.engine.dispose()
    print(json.dumps({"applied": result.applied, "committed_attempt": result.committed_attempt}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
