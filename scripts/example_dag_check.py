"""The wheel check's last step (``scripts/test_matrix.py``): an example DAG commits in a fresh
environment that holds only a user's Airflow, PySpark and Spark provider, and the provider's wheel.

Run by that environment's Python (the provider imported from the wheel, never from this
checkout); ``airflow db migrate`` on the metadata database the environment names, then
``dag.test()`` of ``dags/example_txn_words.py`` for txids 1..N, each a manual run naming its txid,
on the Spark the installed PySpark runs (spark-submit on 3.5: ``compat.spark.DEFAULT_SPARK_MODE``).
Ground truth without the generator: every generated line has ``words_per_line`` words, so the
committed counts add up to that many per line of the batches the log recorded. Prints one JSON
line; exits 1 unless every txid committed and the counts add up.

    python scripts/example_dag_check.py --dags dags --log-url postgresql+psycopg://… --txids 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def check(dags: Path, log_url: str, txids: int) -> dict[str, Any]:
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True)

    import airflow_txn_provider
    from airflow_txn_provider.timetables import txid_logical_date
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

    sys.path.insert(0, str(dags))  # the example's helper module, as Airflow's DAG folder has it
    spec = importlib.util.spec_from_file_location(
        "example_txn_words", dags / "example_txn_words.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    pipeline = example.pipeline
    found: dict[str, Any] = {
        "provider": airflow_txn_provider.__file__,
        "pipeline": pipeline.name,
        "spark": pipeline.spark,
    }
    for txid in range(1, txids + 1):
        run = example.dag.test(logical_date=txid_logical_date(txid), run_conf={"txid": txid})
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        if run.state != "success":
            return {**found, "ok": False, "txid": txid, "tasks": states}

    txlog = TransactionLog.from_url(log_url, migrate=False)
    try:
        batches = [txlog.transaction(pipeline.name, t).metadata for t in range(1, txids + 1)]
        lines = sum(end - start for batch in batches for start, end in batch.values())
        counts = pipeline.states[0]
        with txlog.engine.connect() as conn:
            words = sum(counts.items(conn).values())
        committed = txlog.last_committed(pipeline.name)
    finally:
        txlog.engine.dispose()
    expected = lines * pipeline.source.words_per_line
    ok = committed == txids and words == expected
    return {**found, "ok": ok, "committed": committed, "words": words, "expected": expected}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dags", type=Path, required=True)
    parser.add_argument("--log-url", required=True)
    parser.add_argument("--txids", type=int, default=2)
    args = parser.parse_args()
    result = check(args.dags.resolve(), args.log_url, args.txids)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
