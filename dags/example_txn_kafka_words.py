"""Word count from a Kafka topic: Storm's transactional spout, over Kafka as the seed describes it.

Each txid's batch is a range of offsets per partition of the topic ``words``
(:class:`~airflow_txn_provider.sources.kafka.KafkaSource`, at most 10 000 records a
partition), decided at begin from the partitions' watermarks and stored in the transaction log:
a replay reads exactly the same records. Each record's value is a line of text; the word counts
are a transactional state (``spark_jobs/kafka_word_count.py``).

**Needs a Kafka cluster:** the Airflow connection ``kafka_default`` of type ``kafka``, whose
Config Dict is the cluster's client settings, e.g. ``{"bootstrap.servers": "broker:9092"}`` (SASL
and SSL settings go there too, never on a command line), and ``confluent-kafka`` on the workers
(the ``kafka`` extra). ``$TXN_EXAMPLES_KAFKA_TOPIC`` names another topic. Without a cluster each
begin fails with a ``SourceError`` naming the topic, and nothing is begun. A broker that lost its
log (or the topic created again) stops the pipeline with ``SourceLogChangedError``;
``$TXN_EXAMPLES_KAFKA_RESET_FROM_TXID`` declares the reset an operator decides on then
(docs/sources.md, "When a Kafka log is lost").

**Try it.** ``make demo`` runs a Kafka broker on 127.0.0.1 as ``kafka_default`` (Tansu, its log
in memory: a restarted demo declares the reset) and writes 20 lines a second to ``words``; the
Docker stack runs a real Kafka (``docker/README.md`` shows how to write lines to it). Unpause
this DAG and watch one run per txid commit; the Transactions page shows each txid's offsets.
"""

from __future__ import annotations

import os

from airflow_txn_provider import KafkaSource, MapState, TxnPipeline, build_dag
from txn_examples import spark_job

NAME = "example_txn_kafka_words"

txn_pipeline = TxnPipeline(
    name=NAME,
    source=KafkaSource(
        os.environ.get("TXN_EXAMPLES_KAFKA_TOPIC", "words"),
        kafka_conn_id="kafka_default",
        max_per_partition=10_000,
        reset_log_from_txid=int(os.environ.get("TXN_EXAMPLES_KAFKA_RESET_FROM_TXID") or 0) or None,
    ),
    jobs=[spark_job(__file__, "kafka_word_count.py")],
    states=[MapState(NAME, f"{NAME}_counts", "transactional", keys={"word": "text"})],
    max_attempts=3,
)

dag = build_dag(txn_pipeline, doc_md=__doc__, tags=["transactions", "example", "kafka"])
