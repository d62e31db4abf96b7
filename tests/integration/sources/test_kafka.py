"""Kafka sources on a real Spark Connect server, a real Postgres log, and a Kafka wire-protocol
cluster on 127.0.0.1, each test on both clusters of txn_testing/kafka.py: Tansu, a real broker,
and librdkafka's mock cluster (a test the mock cannot run says why and is skipped on it).

Producers keep writing while txids begin, process and commit; ground truth is computed in plain
Python from what was produced. Faults are caused: a txid failed after its processing (replayed),
the cluster paused with SIGSTOP in the middle of a batch's read and of a begin, a topic deleted
and created again, and the broker's log lost (a restarted broker).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_txn_provider.operators.spark_runner import SparkConnectRunner
from airflow_txn_provider.rules.exceptions import SourceError, SourceLogChangedError
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.sources.kafka import KafkaSource, OpaqueKafkaSource, offset_ranges
from airflow_txn_provider.spark.connect_sessions import keep_classic_mode
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import random_lines, word_counts
from txn_testing.kafka import CLUSTERS, PARTITIONS, KafkaCluster, kafka_cluster

JOB = Path(__file__).resolve().parents[3] / "spark_jobs" / "kafka_word_count.py"
SEED = 3101


@pytest.fixture(scope="module", params=CLUSTERS)
def cluster(request) -> Iterator[KafkaCluster]:
    """Each cluster of txn_testing/kafka.py, shared by this module's tests on it."""
    with kafka_cluster(request.param) as started:
        print(f"Kafka cluster: {started.name} at {started.bootstrap_servers}")
        yield started


@pytest.fixture
def kafka(cluster, monkeypatch) -> KafkaCluster:
    """The cluster, and ``kafka_default`` naming it (an Airflow connection of the Kafka
    provider's type)."""
    _use_cluster(monkeypatch, cluster)
    return cluster


def _pipeline(txlog, name, kind):
    txlog.register_pipeline(name, source_kind=kind, max_pending=4)
    return MapState(name, f"{name}_words", kind, keys={"word": "text"}).create(txlog.engine)


def _counts(txlog, state):
    with txlog.engine.connect() as conn:
        return {k[0]: v for k, v in state.items(conn).items()}


class Producer(threading.Thread):
    """Writes ``rounds`` rounds of seeded lines to ``topic``, a pause between rounds."""

    def __init__(self, kafka, topic, seed, rounds=6, per_round=24, pause=0.4):
        super().__init__(daemon=True)
        self.kafka, self.topic, self.pause = kafka, topic, pause
        self.rounds = [random_lines(seed + n, per_round) for n in range(rounds)]
        self.written: list[str] = []
        self.error: BaseException | None = None

    def more(self):
        """One more round, now (in every partition)."""
        lines = random_lines(len(self.rounds) + 10**6, 8)
        self.kafka.produce(self.topic, lines)
        self.written += lines

    def run(self):
        try:
            for lines in self.rounds:
                self.kafka.produce(self.topic, lines)
                self.written += lines
                time.sleep(self.pause)
        except BaseException as err:  # surfaced by the test
            self.error = err


def _drain(txlog, pipeline, source, runner, producer, *, fail_txid):
    """Begin, process and commit txids until the producer is done and nothing is left; the
    first attempt of ``fail_txid`` fails after its processing, and more records are written
    (:meth:`Producer.more`) before it is replayed. Returns the first and the replayed metadata
    of ``fail_txid``."""
    replays = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        e = txlog.begin_next(pipeline, source)
        if e is None or not e.emitted:
            if not producer.is_alive():
                break
            time.sleep(0.2)
            continue
        runner.run(BatchJob(pipeline, e.txid, e.attempt, source), txlog)
        if e.txid == fail_txid and not replays:
            replays.append(e.metadata)
            txlog.fail(pipeline, e.txid, e.attempt, error="injected after processing")
            producer.more()  # records arrive before the replay
            again = txlog.begin(pipeline, e.txid, source)
            replays.append(again.metadata)
            runner.run(BatchJob(pipeline, again.txid, again.attempt, source), txlog)
            e = again
        assert commit_registered(txlog, pipeline, e.txid, e.attempt).applied
    producer.join(30)
    assert producer.error is None, producer.error
    return replays


def test_transactional_txids_read_every_record_once_while_producers_write(
    txlog, kafka, connect_server
):
    print(f"seed {SEED}")
    state = _pipeline(txlog, "kafka_tx", "transactional")
    source = KafkaSource("words_tx", max_per_partition=10)
    producer = Producer(kafka, "words_tx", SEED)
    producer.start()
    runner = SparkConnectRunner(JOB, url=connect_server.url)
    first, replayed = _drain(txlog, "kafka_tx", source, runner, producer, fail_txid=2)
    assert replayed == first  # a transactional replay reads the same offsets
    assert set(offset_ranges(first)) == {f"words_tx-{p}" for p in range(PARTITIONS)}
    assert txlog.last_committed("kafka_tx") >= 3
    assert _counts(txlog, state) == dict(word_counts(producer.written))


def test_an_opaque_replay_takes_the_records_that_arrived_meanwhile(txlog, kafka, connect_server):
    print(f"seed {SEED + 1}")
    state = _pipeline(txlog, "kafka_opaque", "opaque")
    source = OpaqueKafkaSource("words_opaque", max_per_partition=1000)
    producer = Producer(kafka, "words_opaque", SEED + 1)
    producer.start()
    runner = SparkConnectRunner(JOB, url=connect_server.url)
    first, replayed = _drain(txlog, "kafka_opaque", source, runner, producer, fail_txid=2)
    first, replayed = offset_ranges(first), offset_ranges(replayed)
    starts = {k: r[0] for k, r in first.items()}
    assert {k: r[0] for k, r in replayed.items()} == starts  # from the previous txid's end
    assert sum(r[1] for r in replayed.values()) > sum(r[1] for r in first.values())
    assert _counts(txlog, state) == dict(word_counts(producer.written))


def test_a_range_is_read_exactly_with_the_columns_of_sparks_kafka_source(kafka, connect_server):
    from pyspark.sql import SparkSession

    values = [f"record {n}" for n in range(12)]
    kafka.produce("exact", values, partition=1)
    kafka.produce("exact", ["elsewhere"] * 3, partition=2)
    metadata = {"exact-1": [2, 9], "exact-2": [1, 3], "exact-0": [0, 0]}
    # a session of its own; the process's later classic sessions stay classic
    with keep_classic_mode():
        spark = SparkSession.builder.remote(connect_server.url).create()
        try:
            rows = KafkaSource("exact").read_batch(spark, metadata).collect()
        finally:
            spark.stop()
    got = sorted((r.partition, r.offset, r.value.decode()) for r in rows)
    expected = [(1, n, f"record {n}") for n in range(2, 9)]
    expected += [(2, 1, "elsewhere"), (2, 2, "elsewhere")]
    assert got == expected
    row = rows[0]
    assert row.topic == "exact" and row.key is None and row.headers == []
    assert row.timestamp is not None and row.timestampType == 0


def test_a_paused_cluster_fails_the_read_and_the_begin_then_the_txid_heals(
    txlog, kafka, connect_server
):
    rng = random.Random(SEED + 2)
    print(f"seed {SEED + 2}")
    lines = random_lines(rng.randrange(10**6), 40)
    kafka.produce("paused", lines)
    state = _pipeline(txlog, "kafka_paused", "transactional")
    source = KafkaSource("paused", read_timeout=4, request_timeout=3)
    runner = SparkConnectRunner(JOB, url=connect_server.url)
    e = txlog.begin_next("kafka_paused", source)
    kafka.pause()  # SIGSTOP: connections stay open, nothing answers
    try:
        with pytest.raises(Exception, match="nothing for 4 s"):
            runner.run(BatchJob("kafka_paused", e.txid, e.attempt, source), txlog)
    finally:
        kafka.resume()
    info = txlog.transaction("kafka_paused", 1)
    assert info.status is TxStatus.FAILED
    assert "TimeoutError: Kafka partition paused-" in info.last_error  # the worker's own words
    again = txlog.begin("kafka_paused", 1, source)
    assert again.metadata == e.metadata  # a transactional replay: the same offsets
    runner.run(BatchJob("kafka_paused", 1, again.attempt, source), txlog)
    assert commit_registered(txlog, "kafka_paused", 1, again.attempt).applied

    # a begin asks the cluster for the partitions' watermarks: paused, it is refused and nothing
    # is begun; resumed, the next begin goes on from where txid 1 ended
    more = random_lines(rng.randrange(10**6), 12)
    kafka.produce("paused", more)
    kafka.pause()
    try:
        with pytest.raises(SourceError, match="Kafka topic 'paused'"):
            txlog.begin_next("kafka_paused", source)
        assert txlog.transaction("kafka_paused", 2) is None
    finally:
        kafka.resume()
    two = txlog.begin_next("kafka_paused", source)
    assert two.txid == 2 and all(r[0] == 10 for r in offset_ranges(two.metadata).values())
    runner.run(BatchJob("kafka_paused", 2, two.attempt, source), txlog)
    assert commit_registered(txlog, "kafka_paused", 2, two.attempt).applied
    assert _counts(txlog, state) == dict(word_counts(lines + more))


def _use_cluster(monkeypatch, cluster):
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": cluster.config})
    )


def _commit_all(txlog, name, source, runner) -> None:
    """Begin, process and commit txids until the source has nothing more."""
    while (e := txlog.begin_next(name, source)) is not None and e.emitted:
        runner.run(BatchJob(name, e.txid, e.attempt, source), txlog)
        assert commit_registered(txlog, name, e.txid, e.attempt).applied


LOST_LOG_CASES = [
    pytest.param(
        cluster,
        source_class,
        recover,
        id=f"{cluster}-{source_class.__name__}-{recover}",
        # CI: every case on the real broker, the mock's first (make test-scenarios: the rest)
        marks=()
        if cluster == "tansu" or (source_class is KafkaSource and recover == "reset")
        else pytest.mark.scenario,
    )
    for cluster in CLUSTERS
    for source_class in (KafkaSource, OpaqueKafkaSource)
    for recover in ("reset", "rewind")
]


@pytest.mark.parametrize(("cluster_name", "source_class", "recover"), LOST_LOG_CASES)
def test_a_lost_log_refilled_past_its_old_end_is_refused_until_an_operator_recovers(
    txlog, connect_server, monkeypatch, cluster_name, source_class, recover
):
    """The broker loses its log (restarted: Tansu keeps it in memory; the mock starts every
    partition again at offset 0) and producers write past the old end. The read of a txid begun
    before the loss, its replay and the next begin are all refused, however far the new log
    grows. Then the operator's way out: a declared reset at the txid refused (the state: what
    committed from the old log plus all of the new), or a rewind to txid 1 with the reset
    declared there (the state: all of the new log, nothing of the old)."""
    rng = random.Random(SEED + 3)
    print(f"seed {SEED + 3}; {cluster_name}; {source_class.__name__}; {recover}")
    name = "kafka_lost"
    state = _pipeline(txlog, name, source_class.kind.value)
    runner = SparkConnectRunner(JOB, url=connect_server.url)
    source = source_class("lost", max_per_partition=5, request_timeout=10)
    with kafka_cluster(cluster_name) as cluster:  # its own: the loss is the whole broker's
        _use_cluster(monkeypatch, cluster)
        # 10 records a partition, each partition's written in order
        old_lines = [random_lines(rng.randrange(10**6), 10) for _ in range(PARTITIONS)]
        for partition, lines in enumerate(old_lines):
            cluster.produce("lost", lines, partition=partition)
        old_id = cluster.topic_id("lost") if cluster.describes_topics else None
        one = txlog.begin_next(name, source)
        runner.run(BatchJob(name, 1, one.attempt, source), txlog)
        assert commit_registered(txlog, name, 1, one.attempt).applied
        two = txlog.begin_next(name, source)  # [5, 10) of each partition, not read yet
        assert all(r == [5, 10] for r in offset_ranges(two.metadata).values())
        committed = [line for lines in old_lines for line in lines[:5]]  # txid 1's [0, 5)

        cluster.lose_log()
        _use_cluster(monkeypatch, cluster)  # the mock's new cluster has an address of its own
        new_lines = random_lines(rng.randrange(10**6), 60)  # 15 a partition: past the old end
        cluster.produce("lost", new_lines)
        # the attempt begun before the loss reads other records at its offsets: its read fails
        with pytest.raises(Exception, match=r"SourceLogChangedError|not the one the txid recorded"):
            runner.run(BatchJob(name, 2, two.attempt, source), txlog)
        assert txlog.transaction(name, 2).status is TxStatus.FAILED
        for _ in range(2):  # a replay, again after the log grew further: refused each time
            with pytest.raises(SourceLogChangedError) as raised:
                txlog.begin(name, 2, source)
            err = raised.value
            assert (err.pipeline, err.txid) == (name, 2) and err.partition.startswith("lost-")
            if cluster.describes_topics:  # a new topic on the restarted broker: a new id
                new_id = cluster.topic_id("lost")
                assert old_id in err.recorded and new_id in err.current and old_id != new_id
            else:  # the mock names no topic id: the anchor's record tells the logs apart
                assert "fingerprint" in err.recorded and "another record" in err.current
            more = random_lines(rng.randrange(10**6), 40)
            cluster.produce("lost", more)
            new_lines += more
        assert txlog.last_committed(name) == 1

        if recover == "reset":
            reset = source_class(
                "lost", max_per_partition=1000, request_timeout=10, reset_log_from_txid=2
            )
            again = txlog.begin(name, 2, reset)
            assert again.attempt == 2 and again.metadata["reset"] == {
                f"lost-{p}": [5, 0] for p in range(PARTITIONS)
            }
            runner.run(BatchJob(name, 2, again.attempt, reset), txlog)
            assert commit_registered(txlog, name, 2, again.attempt).applied
            expected = committed + new_lines
        else:
            txlog.rewind(name, 1, by="test", reason="the broker lost its log")
            reset = source_class(
                "lost", max_per_partition=1000, request_timeout=10, reset_log_from_txid=1
            )
            expected = new_lines
        _commit_all(txlog, name, reset, runner)
        if recover == "reset" or source_class is KafkaSource:  # an opaque txid 1 reads afresh
            assert txlog.transaction(name, 1 if recover == "rewind" else 2).metadata["reset"]
    assert _counts(txlog, state) == dict(word_counts(expected))


def test_a_topic_created_again_is_refused_naming_both_topic_ids(txlog, kafka, connect_server):
    """A topic deleted and created under the same name is another log (a new topic id), even
    where its offsets look the same: the next begin is refused, naming pipeline, txid, partition
    and both ids; a declared reset then reads the new topic from its start, exactly."""
    if not kafka.deletes_topics or not kafka.describes_topics:
        pytest.skip(f"the {kafka.name} cluster cannot delete a topic nor say a topic's id")
    rng = random.Random(SEED + 4)
    print(f"seed {SEED + 4}; {kafka.name}")
    name = "kafka_again"
    state = _pipeline(txlog, name, "transactional")
    runner = SparkConnectRunner(JOB, url=connect_server.url)
    source = KafkaSource("again", request_timeout=10)
    first = random_lines(rng.randrange(10**6), 20)
    kafka.produce("again", first)
    old_id = kafka.topic_id("again")
    _commit_all(txlog, name, source, runner)
    kafka.delete_topic("again")
    second = random_lines(rng.randrange(10**6), 40)  # past the old end in every partition
    kafka.produce("again", second)
    new_id = kafka.topic_id("again")
    assert new_id != old_id
    with pytest.raises(SourceLogChangedError) as raised:
        txlog.begin_next(name, source)
    err = raised.value
    assert (err.pipeline, err.txid, err.attempt) == (name, 2, 1)  # the attempt it would be
    assert err.partition.startswith("again-") and f"pipeline={name} txid=2" in str(err)
    assert old_id in err.recorded and new_id in err.current
    assert txlog.transaction(name, 2) is None  # nothing begun
    _commit_all(
        txlog, name, KafkaSource("again", request_timeout=10, reset_log_from_txid=2), runner
    )
    assert _counts(txlog, state) == dict(word_counts(first + second))


@pytest.mark.scenario  # make test-scenarios: a spark-submit JVM per txid (CI: the Connect tests)
def test_a_spark_submit_driver_reads_the_connection_its_task_handed_it(
    txlog, db_url, kafka, monkeypatch
):
    """The ``spark-submit`` path: the task hands the Kafka connection's settings to the driver
    in its environment (``TXN_CONN_KAFKA__KAFKA_DEFAULT``), never its arguments; the driver,
    which has no Airflow connection to look up, reads them and the batch."""
    from airflow_txn_provider.operators.spark_runner import SparkSubmitRunner

    lines = random_lines(SEED + 3, 24)
    kafka.produce("submitted", lines)
    state = _pipeline(txlog, "kafka_submit", "transactional")
    source = KafkaSource("submitted")
    e = txlog.begin_next("kafka_submit", source)  # the task's side: Airflow's lookup
    handed = source.driver_env()  # looked up here, as the task does
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT")  # the driver can only read what it is handed
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL2", "spark://local%5B2%5D?deploy-mode=client")
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
    runner = SparkSubmitRunner(JOB, log_url=db_url, conn_id="spark_local2", conf=conf, env=handed)
    runner.run(BatchJob("kafka_submit", e.txid, e.attempt, source))
    assert commit_registered(txlog, "kafka_submit", e.txid, e.attempt).applied
    assert _counts(txlog, state) == dict(word_counts(lines))
