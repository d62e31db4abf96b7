"""One round of lines written to the stack's Kafka topic, run inside a container of the stack.

Run by tests/stack/kafka.py as ``podman exec -i <container> python - ARGS < this file`` (it needs
what the project's image has: confluent-kafka, the stack's network, the /data volume). It makes
the topic if the broker has none (4 partitions: the stand-in broker makes none on first use),
writes ``count`` seeded lines round robin over the partitions, one record per produce batch
(Tansu 0.6.0 lists a partition's end as its last batch's first offset + 1: docs/sources.md), and
appends each acknowledged record to ``out`` as a JSON line ``{"topic_id", "partition", "offset",
"line"}``: the ground truth tests/stack/check_examples.py counts the committed offsets' words
from. Prints one JSON object: the topic id and how many were acknowledged.

Usage: ``python - BOOTSTRAP TOPIC COUNT SEED OUT``.
"""

from __future__ import annotations

import json
import os
import random
import sys

from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 4
WORDS = "the quick brown fox jumps over a lazy dog while seven tall ships sail home".split()


def main(bootstrap: str, topic: str, count: int, seed: int, out: str) -> None:
    config = {"bootstrap.servers": bootstrap}
    admin = AdminClient(config)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    topic_id = str(admin.describe_topics(TopicCollection([topic]))[topic].result(60).topic_id)
    rng = random.Random(seed)
    acked: list[dict] = []
    errors: list[str] = []

    def delivered(err, message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(
                {
                    "topic_id": topic_id,
                    "partition": message.partition(),
                    "offset": message.offset(),
                    "line": message.value().decode(),
                }
            )

    producer = Producer({**config, "batch.num.messages": 1, "linger.ms": 0, "acks": "all"})
    for n in range(count):
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        producer.produce(topic, line.encode(), partition=n % PARTITIONS, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(60)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "a") as f:
        f.writelines(json.dumps(record) + "\n" for record in acked)
        f.flush()
        os.fsync(f.fileno())
    print(json.dumps({"topic_id": topic_id, "acked": len(acked), "left": left, "errors": errors}))
    if left or errors:
        sys.exit(1)


main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
