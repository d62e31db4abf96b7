"""A committing process of the fast chaos tier that stops between the lake table's commit and
the log's, to be SIGKILLed there (the ``kill_committer`` fault).

``python -m chaos.committer --pipeline P --txid T --attempt A --sink JSON`` (the log's URL in
``$TXN_LOG_URL``) commits ``(txid, attempt)`` as the driver does
(:func:`~airflow_txn_provider.transactions.commit.commit_registered` with the pipeline's lake
sink), except that once the sink's table commit has returned, inside the log's still open
transaction, it prints one JSON line ``{"table_committed": {...}}`` and sleeps: the driver SIGKILLs
it then. The log's transaction dies with the process (Postgres rolls it back): the table holds the
txid, the log does not. The next commit of the txid must find it in the table and add nothing twice.

If the driver does not kill it within ``--hang`` seconds it goes on and commits (prints
``{"committed": ...}``). Exit codes: 0 committed, 1 the commit failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from airflow_txn_provider.rules.exceptions import TxnError
from airflow_txn_provider.sinks import LakeSink, SinkCommit, sink_from_spec
from airflow_txn_provider.spark.job import LOG_URL_ENV
from airflow_txn_provider.transactions.commit import commit_registered
from airflow_txn_provider.transactions.transaction_log import TransactionLog

TABLE_COMMITTED = "table_committed"


def stop_after_table_commit(sink: LakeSink, hang: float) -> None:
    """Make ``sink``'s commit announce itself on stdout and sleep ``hang`` seconds once the table
    commit has returned (this process only)."""
    commit = type(sink).commit

    def commit_then_hang(self: LakeSink, *args: Any, **kwargs: Any) -> SinkCommit:
        done = commit(self, *args, **kwargs)
        print(json.dumps({TABLE_COMMITTED: done.to_json()}), flush=True)
        time.sleep(hang)
        return done

    type(sink).commit = commit_then_hang  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--txid", required=True, type=int)
    parser.add_argument("--attempt", required=True, type=int)
    parser.add_argument(
        "--sink",
        dest="sinks",
        action="append",
        required=True,
        help="JSON from LakeSink.to_spec() (once per table; it stops after the first's commit)",
    )
    parser.add_argument("--hang", type=float, default=300.0, help="seconds to wait to be killed")
    parser.add_argument("--outage-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    url = os.environ.get(LOG_URL_ENV)
    if not url:
        print(f"error: ${LOG_URL_ENV} is not set", file=sys.stderr)
        return 2
    sinks = [sink_from_spec(spec) for spec in args.sinks]
    stop_after_table_commit(sinks[0], args.hang)
    txlog = TransactionLog.from_url(url, migrate=False, outage_timeout=args.outage_timeout)
    try:
        result = commit_registered(txlog, args.pipeline, args.txid, args.attempt, sinks)
    except TxnError as err:
        logging.getLogger("chaos.committer").error("%s", err)
        return 1
    finally:
        txlog.engine.dispose()
    print(
        json.dumps({"committed": result.applied, "details": result.details}, default=str),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
