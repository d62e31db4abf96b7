"""The Kafka example in the stack test: the lines fed to its broker, and the broker's two faults.

The broker is the ``kafka`` service of docker/compose.yaml on its own container and address,
running the stand-in image tagged as ``apache/kafka`` (tests/stack/images/kafka.Containerfile:
Tansu, its log in memory). Lines are written in rounds from the spark-master container
(tests/stack/kafka_feed.py), which appends every acknowledged record to the /data volume: the
ground truth tests/stack/check_examples.py counts the committed offsets' words from.

* ``pause_kafka``: the broker container frozen (``podman pause``) for 60 s while a txid of the
  example is begun, then thawed: the pipeline heals by itself.
* ``lose_kafka_log``: the broker container killed and started again, its log gone (the stand-in
  keeps it in memory; with the official image, the ``kafka-data`` volume lost). New lines make
  the topic again (a new topic id). The pipeline stops with the typed refusal
  (``SourceLogChangedError``) in its health endpoint and on the Transactions page; then the
  operator's declared reset: ``TXN_EXAMPLES_KAFKA_RESET_FROM_TXID`` in the env file at the txid
  after the last committed one, the Airflow services created again with it (``docker compose up
  -d``), and the pipeline goes on from the new log's start.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.stack.common import say, wait_until
from txn_testing.podman import STACK, podman

if TYPE_CHECKING:
    from tests.stack.run import Stack

NAME = "example_txn_kafka_words"
TOPIC = "words"
FEED_FILE = "/data/txn_examples/kafka-feed.jsonl"
FEED_LINES = 40
FEED_EVERY = 10.0
"""Seconds between two rounds of ``FEED_LINES`` lines."""
PAUSE_FOR = 60.0
RESET_VARIABLE = "TXN_EXAMPLES_KAFKA_RESET_FROM_TXID"
REFUSAL = "SourceLogChangedError"
AIRFLOW_SERVICES = [
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
]
"""What ``docker compose up -d`` creates again after a change of docker/.env's Airflow settings."""


class KafkaFeed:
    """Rounds of lines written to the broker, in a thread; stopped around every fault (a round a
    fault cuts could leave a record the broker took but never acknowledged: outside the ground
    truth)."""

    def __init__(self, stack: Stack, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.acked: dict[str, int] = {}
        """Records acknowledged per topic id (one per log the broker had)."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def round(self) -> dict[str, Any]:
        (container,) = self.stack.compose.container_names("spark-master")
        argv = ["kafka:9092", TOPIC, str(FEED_LINES), str(self.rng.randrange(10**9)), FEED_FILE]
        result = self.stack.compose.exec(
            container,
            ["python", "-", *argv],
            input=(STACK / "kafka_feed.py").read_text(),
            timeout=300,
            check=False,
        )
        try:
            found = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            found = {"topic_id": None, "acked": 0, "errors": [result.stderr[-500:]]}
        if found["topic_id"] is not None:
            self.acked[found["topic_id"]] = self.acked.get(found["topic_id"], 0) + found["acked"]
        if result.returncode != 0:
            self.errors.append(f"a round exited {result.returncode}: {found['errors'][:2]}")
        return found

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def rounds() -> None:
            while not self._stop.is_set():
                self.round()
                self._stop.wait(FEED_EVERY)

        self._thread = threading.Thread(target=rounds, name="kafka-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=400)
            self._thread = None


def committed_records(stack: Stack, topic_id: str) -> int:
    """Records of the log ``topic_id`` that committed txids of the example read."""
    rows = stack.sql(
        f"select metadata from txn_transaction where pipeline = '{NAME}' and status = 'committed'"
    )
    total = 0
    for (metadata,) in rows:
        batch = json.loads(metadata)
        if (batch.get("log") or {}).get("topic_id") == topic_id:
            total += sum(e - s for k, (s, e) in batch.items() if k.startswith(f"{TOPIC}-"))
    return total


def health(stack: Stack) -> dict[str, Any]:
    """The example's health endpoint, as a monitor reads it (the admin's token)."""
    response = httpx.get(
        f"{stack.url}/transactions/api/pipelines/{NAME}/health",
        headers=stack.api().http.headers,
        timeout=60,
    )
    return {"code": response.status_code, **response.json()}


def pause(stack: Stack, feed: KafkaFeed, mark: Callable[[], None]) -> tuple[str, Callable]:
    """One round fed, the broker frozen once a txid of it is begun; thawed ``PAUSE_FOR`` later."""
    (target,) = stack.compose.container_names("kafka")
    before = stack.progress()[NAME][1]
    feed.round()
    try:
        wait_until("a txid of the round begun", lambda: stack.progress()[NAME][1] > before, 120)
        begun = "a txid of it begun"
    except TimeoutError:
        begun = "no txid begun within 120 s"
    mark()
    podman("pause", target)

    def thaw() -> None:
        time.sleep(PAUSE_FOR)
        podman("unpause", target)

    return f"{target} frozen {PAUSE_FOR:.0f} s ({begun}; podman pause)", thaw


def lose_log(
    stack: Stack, feed: KafkaFeed, mark: Callable[[], None], findings: list[str]
) -> tuple[str, Callable]:
    """The broker killed and started with its log gone, once the example read all it was fed;
    then the refusal seen where people look, the operator's reset, and the pipeline going on."""
    (target,) = stack.compose.container_names("kafka")
    old = next(reversed(feed.acked))
    wait_until(
        "every line fed committed",
        lambda: committed_records(stack, old) >= feed.acked[old],
        900,
    )
    done = stack.progress()[NAME][0]
    mark()
    stack.compose.kill(target)

    def come_back() -> None:
        started = time.monotonic()
        podman("start", target)
        stack.compose.wait_healthy(["kafka"])
        new = feed.round()["topic_id"]
        say(f"  {target} started again: its log is gone; the topic made again, id {new}")

        def refused() -> dict[str, Any] | None:
            found = health(stack)
            return found if found["code"] == 503 and REFUSAL in (found["reason"] or "") else None

        seen = wait_until(f"{REFUSAL} in the health endpoint", refused, 600)
        took = time.monotonic() - started
        say(f"  health endpoint: 503, {seen['reason'][:200]}")
        page_shows_refusal(stack)
        findings.append(
            f"lose_kafka_log: the refusal ({REFUSAL}, topic ids {old} -> {new}) in the health "
            f"endpoint (503) and on the Transactions page {took:.0f} s after the broker came "
            f"back; nothing committed meanwhile (last committed txid {done})"
        )
        assert stack.progress()[NAME][0] == done, "a txid committed past the lost log"
        declare_reset(stack, done + 1)
        findings.append(
            f"lose_kafka_log: reset declared at txid {done + 1} "
            f"({RESET_VARIABLE}, the Airflow services created again)"
        )

    return f"{target} (killed, started again with its log lost)", come_back


def page_shows_refusal(stack: Stack) -> None:
    from tests.browser import chromium_page, login, screenshot, screenshot_on_failure

    with chromium_page() as page, screenshot_on_failure(page, "stack-kafka-refusal-failure"):
        login(page, stack.url, "admin", stack.env["AIRFLOW_ADMIN_PASSWORD"])
        page.goto(f"{stack.url}/transactions/pipelines/{NAME}")
        page.locator("#health").get_by_text(REFUSAL).wait_for(timeout=60_000)
        screenshot(page, "stack-kafka-log-lost", full_page=True)
    say(f"  the Transactions page's health card of {NAME} names {REFUSAL}")


def declare_reset(stack: Stack, txid: int) -> None:
    """What the operator does: the reset in docker/.env, then ``docker compose up -d``, which
    creates the Airflow services again with it (the DAG reads it at parse time)."""
    env_file: Path = stack.compose.env_file
    env_file.write_text(env_file.read_text() + f"{RESET_VARIABLE}={txid}\n")
    stack.env[RESET_VARIABLE] = str(txid)
    started = time.monotonic()
    stack.compose.compose(
        "up", "-d", "--no-build", "--no-deps", "--force-recreate", *AIRFLOW_SERVICES
    )
    # the REST API back; the rest shows in the heal (a Celery worker's ping has taken 53 s
    # under this test's load, past its healthcheck's timeout, while it ran tasks)
    stack.compose.wait_healthy(["airflow-api-server"])
    stack._api = None
    took = time.monotonic() - started
    say(f"  {RESET_VARIABLE}={txid}: Airflow's services created again ({took:.0f} s)")


def reset_committed(stack: Stack) -> dict[str, Any]:
    """The reset's txid as the log recorded it: its ``reset`` note, once committed."""
    txid = int(stack.env[RESET_VARIABLE])
    rows = stack.sql(
        f"select status, metadata from txn_transaction where pipeline = '{NAME}' and txid = {txid}"
    )
    (status, metadata), *_ = rows
    note = json.loads(metadata).get("reset")
    assert status == "committed" and note, f"txid {txid}: {status}, reset note {note!r}"
    return {"txid": txid, "reset": note}
