"""A Kafka cluster for tests: librdkafka's mock cluster, Kafka's wire protocol on 127.0.0.1.

No Kafka broker can be installed on these machines. confluent-kafka's bundled librdkafka starts a
mock cluster inside any client configured with ``test.mock.num.brokers``; other processes then
produce, fetch, list offsets and read watermarks against it over TCP, as against a broker.
:class:`MockKafkaCluster` hosts one in a process of its own (``python -m txn_testing.kafka``), so
that a test can pause it (SIGSTOP) like a broker that hangs. Topics are created on first use,
with :data:`PARTITIONS` partitions.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

PARTITIONS = 4
"""Partitions of a topic the mock cluster creates on first use (librdkafka's mock default)."""
_BOOTSTRAP = re.compile(r"bootstrap\.servers=(\S+)")


class MockKafkaCluster:
    """The mock cluster in a child process; :attr:`bootstrap_servers` once started."""

    def __init__(self, brokers: int = 1) -> None:
        self.brokers = brokers
        self.bootstrap_servers = ""
        self.proc: subprocess.Popen[str] | None = None

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

    @property
    def config(self) -> dict[str, Any]:
        """A client's settings for this cluster (an Airflow ``kafka`` connection's Config Dict)."""
        return {"bootstrap.servers": self.bootstrap_servers}

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

        producer = Producer({**self.config, "acks": "all", "linger.ms": 5})
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
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> MockKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
