"""The Kafka example on a real Airflow, its broker paused with SIGSTOP in the middle of a batch.

``example_txn_kafka_words`` as a user drops it in, on the shared deployment
(``tests/integration/conftest.py``: scheduler, dag-processor, triggerer and api-server on a
Postgres metadata database, jobs on the session's Spark Connect server). Its topic lives on a
real Kafka-protocol broker on 127.0.0.1 (Tansu, a process of its own: txn_testing/kafka.py), read
through the Airflow connection ``kafka_default``.

Txid 1's first attempt fails (failure injection): it replays, with the txids in flight that
fail with it. A producer writes seeded rounds of lines while txids begin, process and commit.
As soon as a txid is begun after a round, the cluster is SIGSTOPped (connections stay open,
nothing answers: a broker that hangs) for a seeded time longer than a batch takes, then
resumed. The pipeline waits and heals: the paused txid commits after the resume, and in the end
the committed txids' offsets tile every partition from its first record to its last, once, and
the word counts equal ground truth computed in plain Python from what was produced.

Then the pipeline is rewound to a seeded txid N with the CLI (``python -m
airflow_txn_provider.rewind``), as an operator would after fixing a job: the counts go back to
after N - 1, the runs of N and later are restarted through the REST API, each of those txids
commits again with a new attempt over the same offsets. Then rewound once more, to txid 1, from
the plugin's API as the admin: written to Airflow's event log, the runs restarted by the
api-server. The counts equal ground truth at the end (a rollback that missed a key would count
it twice). Its OpenLineage events follow the spec: schemas, names, each run ended once.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from openlineage.client.serde import Serde

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.exceptions import UnknownPipelineError
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sources.kafka import offset_ranges
from airflow_txn_provider.state import MapState
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.utils.lineage import BATCH_FACET, RUN_FACET
from tests.conftest import wait_until
from tests.integration.conftest import KAFKA_TOPIC
from tests.spark_data import random_lines, word_counts
from txn_testing.airflow import ADMIN_USER
from txn_testing.openlineage import set_from_outside

NAME = "example_txn_kafka_words"
INJECT = f"txn_inject_failure__{NAME}"
SEED = 3131
PER_ROUND = 60


def _begun_uncommitted(txlog: TransactionLog, after: int, timeout: float) -> int | None:
    """The first txid above ``after`` that is begun and not committed, looked for every 50 ms
    (a batch of this size begins, processes and commits in seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in txlog.transactions(NAME, since_txid=after):
            if info.status is not TxStatus.COMMITTED:
                return info.txid
        time.sleep(0.05)
    return None


def _committed_in_lineage(events: list[dict]) -> set[tuple[int, int]]:
    """``(txid, attempt)`` of each OpenLineage event that names outputs (a commit's)."""
    facets = [e["run"]["facets"][RUN_FACET] for e in events if e["outputs"]]
    return {(f["txid"], f["attempt"]) for f in facets}


def _commit_skipped(api: Any, txid: int) -> bool:
    """Whether the commit task of ``txid``'s run was skipped: the claim's retry found the txid
    committed by a try whose success report Airflow lost, so no commit task named its outputs."""
    tis = api.task_instances(NAME, txid_run_id(txid))
    return any(ti["task_id"] == "commit" and ti["state"] == "skipped" for ti in tis)


def _committed_ranges(txlog: TransactionLog) -> list[dict[str, list[int]]]:
    return [  # the offsets, without the notes (the log identity)
        offset_ranges(info.metadata)
        for info in txlog.transactions(NAME)
        if info.status is TxStatus.COMMITTED
    ]


def test_the_kafka_example_reads_every_record_once_through_a_paused_broker(shared_airflow):
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    stack, kafka = shared_airflow.stack, shared_airflow.kafka
    api = stack.client()
    txlog = TransactionLog.from_url(shared_airflow.db_url, migrate=False)
    written: list[str] = []

    def produce() -> None:
        lines = random_lines(rng.randrange(10**6), PER_ROUND)
        kafka.produce(KAFKA_TOPIC, lines)
        written.extend(lines)

    produce()
    api.wait_for_dag(NAME)
    # txid 1's first attempt fails: its failure sensor (and those of the txids in flight that
    # fail with it) wake on a worker, so their lineage runs must end there too, once committed
    api.set_variable(INJECT, "1")
    with shared_airflow.running(NAME):
        wait_until(
            lambda: txlog.last_committed(NAME) >= 1,
            240,
            "txid 1 committed",
            stack,
            ignore=(UnknownPipelineError,),  # until its first task declares it
        )
        api.delete_variable(INJECT)
        produce()
        paused_txid = _begun_uncommitted(txlog, txlog.last_committed(NAME), timeout=120)
        assert paused_txid is not None, stack.tail("scheduler", "triggerer")
        begun = txlog.transaction(NAME, paused_txid)
        pause = rng.uniform(8, 14)  # a batch takes ~3 s here
        print(f"txid {paused_txid} begun ({begun.metadata}); the cluster paused {pause:.1f} s")
        kafka.pause()
        try:
            time.sleep(pause)
        finally:
            kafka.resume()
        resumed = datetime.now(UTC)
        produce()
        total = len(written)

        def all_committed() -> bool:
            ranges = _committed_ranges(txlog)
            return sum(e - s for r in ranges for s, e in r.values()) >= total

        wait_until(all_committed, 300, f"the {total} records produced committed", stack)
        last = txlog.last_committed(NAME)
        attempts = {info.txid: info.attempt for info in txlog.transactions(NAME)}
        before_rewind = datetime.now(UTC)
        to = rng.randrange(2, last + 1)
        cli = [sys.executable, "-m", "airflow_txn_provider.rewind", NAME, "--to", str(to)]
        rewind = subprocess.run(
            [*cli, "--by", "test:operator", "--job-version", "kafka_word_count v2"],
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rewind.returncode == 0, rewind.stdout + rewind.stderr
        print(rewind.stdout)
        assert f"rewound to txid {to} (last committed was {last})" in rewind.stdout

        def recomputed(first: int) -> Callable[[], bool]:
            def done() -> bool:
                infos = [i for i in txlog.transactions(NAME) if first <= i.txid <= last]
                return all(i.status is TxStatus.COMMITTED for i in infos) and len(infos) > 0

            return done

        wait_until(recomputed(to), 300, f"txids {to}..{last} recomputed after the rewind", stack)
        after_cli = {info.txid: info.attempt for info in txlog.transactions(NAME)}

        # again from the plugin's API, as the admin, to the first txid: audited in Airflow's
        # event log, the runs restarted by the api-server itself
        response = api.http.post(
            f"{api.url}/transactions/api/pipelines/{NAME}/rewind",
            json={"to_txid": 1, "reason": "test: from the API"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["rewound"][:1] == [1] and response.json()["by"] == ADMIN_USER
        wait_until(recomputed(1), 300, f"txids 1..{last} recomputed after the API's", stack)
        # this DAG's: the browser test rewinds its own pipeline on the same deployment
        events = api.call("GET", "/eventLogs", params={"event": "txn_rewind", "dag_id": NAME})[
            "event_logs"
        ]
        assert [(e["dag_id"], e["owner"]) for e in events] == [(NAME, ADMIN_USER)]
        assert '"to_txid": 1' in events[0]["extra"]

        # each commit task ends after its txid committed (a worker task start later): wait for
        # the lineage of the committed attempts before the DAG goes idle. Known gap: when Airflow
        # loses the success report of the processing try that committed ("Failed to report
        # terminal task state"), its retry finds the txid committed and skips, and so does the
        # run's commit task: that attempt's outputs are in no event (docs/airflow.md, Lineage)
        def lineage_of_every_commit() -> bool:
            final = {(t, txlog.transaction(NAME, t).attempt) for t in range(1, last + 1)}
            missing = final - _committed_in_lineage(shared_airflow.lineage_events(NAME))
            return all(_commit_skipped(api, t) for t, _ in missing)

        wait_until(lineage_of_every_commit, 120, "the commit tasks' lineage", stack)

    # OpenLineage as a lineage catalog reads it: every event valid against the spec's schemas
    # and its facets' own, each run begun once and ended once; the failure sensors that txid
    # 1's failure woke ended on a worker, with COMPLETE
    woken = [
        e["eventType"]
        for e in shared_airflow.check_lineage(NAME)
        if e["job"]["name"] == f"{NAME}.watch_failures" and not set_from_outside(e)
    ]
    assert "START" in woken and "COMPLETE" in woken, woken

    # the paused txid waited for the broker and committed after it came back, its offsets kept
    paused = txlog.transaction(NAME, paused_txid)
    assert paused.status is TxStatus.COMMITTED
    assert paused.committed_at > resumed, (paused.committed_at, resumed)
    assert paused.metadata == begun.metadata  # a transactional source: the same batch
    # the committed txids tile each partition once, from offset 0 on, and nothing more
    ranges = _committed_ranges(txlog)
    ends: dict[str, int] = {}
    for txid, batch in enumerate(ranges, start=1):
        for partition, (start, end) in sorted(batch.items()):
            assert start == ends.get(partition, 0), (txid, partition, start, ends)
            ends[partition] = end
    assert sum(ends.values()) == total
    state = MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"})
    with txlog.engine.connect() as conn:
        counts = {key[0]: value for key, value in state.items(conn).items()}
    assert counts == dict(word_counts(written))
    # the rewound txids committed again, each with a new attempt per rewind that reached it (or
    # more: Airflow's stale-executor-event race can fail a processing task that resumed within
    # seconds, docs/airflow.md "Known Airflow issue"; that costs an attempt, never a count)
    assert [after_cli[t] - attempts[t] >= 1 for t in range(1, last + 1)] == [
        t >= to for t in range(1, last + 1)
    ]
    assert all(after_cli[t] == attempts[t] for t in range(1, to))  # before N: untouched
    for txid in range(1, last + 1):
        info = txlog.transaction(NAME, txid)
        assert info.attempt > after_cli[txid], (txid, info.attempt, after_cli[txid])
        assert info.committed_at > before_rewind

    # The provider's metrics reached the deployment's StatsD (a server the test owns on
    # 127.0.0.1), sent from where each happens: commits in the triggerer, begins in tasks
    received = shared_airflow.statsd.metrics("airflow.txn.")

    def values(name: str) -> list[float]:
        return [m.value for m in received if m.name == f"airflow.txn.{name}.{NAME}"]

    assert max(values("last_committed_txid")) == last, sorted({m.name for m in received})
    assert len(values("commit.duration")) >= 2 * last  # recomputed: committed again at least
    assert sum(values("staged_rows")) > 0 and values("lag.begun")
    # every txid the two rewinds reached was begun again with a new attempt
    assert sum(values("reemissions")) >= (last - to + 1) + last
    assert [m for m in received if m.name == "airflow.txn.last_committed_txid"]  # tags dropped

    # OpenLineage (the provider's file transport): the topic with each attempt's batch as the
    # processing tasks' input; outputs only from a commit task whose attempt committed
    events = shared_airflow.lineage_events(NAME)
    history = {t: {a.attempt: a for a in txlog.attempts(NAME, t)} for t in range(1, last + 1)}
    outputs = [e for e in events if e["outputs"]]
    for event in outputs:
        txn = event["run"]["facets"][RUN_FACET]
        assert (event["eventType"], event["job"]["name"]) == ("COMPLETE", f"{NAME}.commit"), txn
        attempt = history[txn["txid"]][txn["attempt"]]
        # the attempt committed: it is the txid's committed one, or one a rewind undid
        assert txn["committed"], txn
        assert attempt.status is TxStatus.COMMITTED or attempt.error.startswith("rewound"), txn
        names = {o["name"].rsplit(".", 1)[-1] for o in event["outputs"]}
        assert names == {state.table}, event["outputs"]
    committed = {(t, txlog.transaction(NAME, t).attempt) for t in range(1, last + 1)}
    missing = committed - _committed_in_lineage(events)
    assert all(_commit_skipped(api, t) for t, _ in missing), sorted(missing)
    reads = [e for e in events if e["inputs"]]
    assert {e["job"]["name"] for e in reads} == {f"{NAME}.process_kafka_word_count"}
    for event in reads:
        txn = event["run"]["facets"][RUN_FACET]
        [topic] = event["inputs"]
        assert (topic["namespace"], topic["name"]) == (
            f"kafka://{shared_airflow.kafka.bootstrap_servers.split(',')[0]}",
            KAFKA_TOPIC,
        )
        batch = topic["inputFacets"][BATCH_FACET]["batch"]
        # the OpenLineage client leaves every null out of what it sends
        metadata = Serde.remove_nulls_and_enums(history[txn["txid"]][txn["attempt"]].metadata)
        assert batch == metadata, txn
