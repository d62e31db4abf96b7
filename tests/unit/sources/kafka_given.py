"""A Kafka source over a topic given as plain values (no cluster), shared by the tests of the
sources' Airflow side (not a test module: tests import from here, never from each other)."""

from __future__ import annotations

import dataclasses

from airflow_txn_provider.sources.kafka_log import Anchor, Seen


def given_topic(cls, marks, logs=None, *, topic_id=None, **kw):
    """A source of ``cls`` whose topic's watermarks are ``marks`` ({key: (earliest, latest)}),
    whose topic id is ``topic_id`` and whose logs hold ``logs`` ({key: {offset: fingerprint}},
    each record of leader epoch 0; none by default: nothing to anchor)."""

    @dataclasses.dataclass(frozen=True)
    class Given(cls):  # type: ignore[misc, valid-type]
        def watermarks(self):
            return dict(marks)

        def topic_id(self):
            return topic_id

        def log_now(self, positions, marks_now, txid):
            seen = {}
            for key, (offset, _epoch) in positions.items():
                held = (logs or {}).get(key, {})
                low, high = marks_now[key]
                if offset >= high:
                    seen[key] = Seen(ends_at=high)
                elif offset >= low and offset in held:
                    seen[key] = Seen(anchor=Anchor(offset, 0, held[offset], txid))
            return seen

    return Given("words", **kw)
