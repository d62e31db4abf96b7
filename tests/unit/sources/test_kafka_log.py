"""A Kafka txid's log identity, with recorded identities and logs given as plain values: what
counts as another log (``log_changes``), and what a begin, a replay and a declared reset do with
it. A refilled log on a real (mock) cluster is tests/integration/sources/test_kafka.py."""

from __future__ import annotations

import pytest

from airflow_txn_provider.rules.exceptions import SourceLogChangedError
from airflow_txn_provider.sources.kafka import KafkaSource, OpaqueKafkaSource, offset_ranges
from airflow_txn_provider.sources.kafka_log import (
    LOG,
    RESET,
    Anchor,
    LogIdentity,
    Seen,
    log_changes,
)
from tests.unit.sources.kafka_given import given_topic


def _recorded(topic_id=None, **anchors):
    return LogIdentity(topic_id, {k.replace("_", "-"): a for k, a in anchors.items()})


class TestLogChanges:
    def test_the_same_log_is_no_change(self):
        recorded = _recorded("t1", words_0=Anchor(9, 0, "aaaa", 1))
        seen = {"words-0": Seen(anchor=Anchor(9, 0, "aaaa", 2))}
        assert log_changes(recorded, "t1", seen) == {}

    def test_another_topic_id_is_another_log_for_every_partition(self):
        recorded = _recorded("t1", words_0=Anchor(9, 0, "a", 1), words_1=Anchor(3, 0, "b", 1))
        changes = log_changes(recorded, "t2", {})
        assert sorted(changes) == ["words-0", "words-1"]
        assert "topic id was t1, now t2" in changes["words-0"]

    def test_another_record_at_the_anchor_is_another_log(self):
        recorded = _recorded(None, words_0=Anchor(9, 0, "aaaa", 1))
        seen = {"words-0": Seen(anchor=Anchor(9, 0, "bbbb", 2))}
        (why,) = log_changes(recorded, None, seen).values()
        assert "another record is at offset 9" in why and "recorded aaaa" in why

    def test_a_truncation_or_a_log_ending_before_the_anchor_is_another_log(self):
        recorded = _recorded(None, words_0=Anchor(9, 3, "a", 1), words_1=Anchor(5, 0, "b", 1))
        seen = {
            "words-0": Seen(truncated=True, detail="epoch 3 ends at 4"),
            "words-1": Seen(ends_at=2),
        }
        changes = log_changes(recorded, None, seen)
        assert "truncated" in changes["words-0"] and "epoch 3 ends at 4" in changes["words-0"]
        assert "now ends at offset 2" in changes["words-1"]

    def test_an_anchor_deleted_or_compacted_away_checks_nothing(self):
        recorded = _recorded(None, words_0=Anchor(9, 0, "a", 1), words_1=Anchor(5, 0, "b", 1))
        # words-0: retention deleted it (not read); words-1: compaction removed it, a later
        # record answered
        seen = {"words-1": Seen(anchor=Anchor(7, 0, "c", 2))}
        assert log_changes(recorded, None, seen) == {}

    def test_an_unknown_topic_id_falls_back_on_the_anchors(self):
        recorded = _recorded("t1", words_0=Anchor(9, 0, "a", 1))
        assert log_changes(recorded, None, {"words-0": Seen(anchor=Anchor(9, 0, "a", 2))}) == {}

    def test_the_identity_survives_json(self):
        identity = _recorded("t1", words_0=Anchor(9, None, "a", 4))
        assert LogIdentity.of({LOG: identity.to_json(), "words-0": [5, 10]}) == identity
        assert LogIdentity.of({"words-0": [5, 10]}) is None  # a txid of an older version


def _source(cls, marks, logs, **kw):
    """``cls`` over a topic whose partitions' watermarks are ``marks`` and whose logs hold
    ``logs`` ({key: {offset: fingerprint}})."""
    return given_topic(cls, marks, logs, **kw)


def _log(prefix, n):
    return {o: f"{prefix}{o}" for o in range(n)}


@pytest.mark.parametrize("cls", [KafkaSource, OpaqueKafkaSource])
def test_a_txid_records_its_newest_record_as_the_anchor_and_the_next_one_checks_it(cls):
    old = {"words-0": _log("old", 10), "words-1": _log("old", 4)}
    source = _source(cls, {"words-0": (0, 10), "words-1": (0, 4)}, old, topic_id="t1")
    first = source.initialize_transaction(1, None)
    assert offset_ranges(first) == {"words-0": [0, 10], "words-1": [0, 4]}
    assert LogIdentity.of(first) == _recorded(
        "t1", words_0=Anchor(9, 0, "old9", 1), words_1=Anchor(3, 0, "old3", 1)
    )
    grown = {"words-0": _log("old", 15), "words-1": _log("old", 4)}
    source = _source(cls, {"words-0": (0, 15), "words-1": (0, 4)}, grown, topic_id="t1")
    second = source.initialize_transaction(2, first)
    assert offset_ranges(second) == {"words-0": [10, 15], "words-1": [4, 4]}
    # words-1 read nothing new: it keeps txid 1's anchor
    assert LogIdentity.of(second).anchors == {
        "words-0": Anchor(14, 0, "old14", 2),
        "words-1": Anchor(3, 0, "old3", 1),
    }


@pytest.mark.parametrize("cls", [KafkaSource, OpaqueKafkaSource])
@pytest.mark.parametrize("refilled_to", [12, 400])
def test_a_lost_log_refilled_past_the_old_end_is_refused_and_the_refusal_never_lapses(
    cls, refilled_to
):
    """The issue's case: the broker lost words-0 and producers wrote past the old end again."""
    old = {"words-0": _log("old", 10)}
    first = _source(cls, {"words-0": (0, 10)}, old).initialize_transaction(1, None)
    refilled = _source(cls, {"words-0": (0, refilled_to)}, {"words-0": _log("new", refilled_to)})
    with pytest.raises(SourceLogChangedError) as raised:
        refilled.initialize_transaction(2, first)
    err = raised.value
    assert (err.txid, err.partition) == (2, "words-0")
    assert "fingerprint old9" in err.recorded and "fingerprint new9" in err.current
    assert "reset_log_from_txid=2" in str(err) and "rewind" in str(err)


def test_a_topic_created_again_is_refused_by_its_topic_id_alone():
    same = {"words-0": _log("x", 10)}  # even the same records: another topic
    first = _source(KafkaSource, {"words-0": (0, 10)}, same, topic_id="t1").initialize_transaction(
        1, None
    )
    again = _source(KafkaSource, {"words-0": (0, 20)}, same, topic_id="t2")
    with pytest.raises(SourceLogChangedError, match="topic id was t1, now t2"):
        again.initialize_transaction(2, first)


def test_a_declared_reset_starts_the_partition_again_on_the_new_log_and_says_so():
    first = _source(KafkaSource, {"words-0": (0, 10)}, {"words-0": _log("old", 10)})
    first_meta = first.initialize_transaction(1, None)
    new_log = {"words-0": _log("new", 30)}
    reset = _source(KafkaSource, {"words-0": (0, 30)}, new_log, reset_log_from_txid=2)
    second = reset.initialize_transaction(2, first_meta)
    assert offset_ranges(second) == {"words-0": [0, 30]}
    assert second[RESET] == {"words-0": [10, 0]}
    assert LogIdentity.of(second).anchors == {"words-0": Anchor(29, 0, "new29", 2)}
    # the reset covers losses before it, never one after: the next loss is refused again
    lost_again = _source(
        KafkaSource, {"words-0": (0, 40)}, {"words-0": _log("third", 40)}, reset_log_from_txid=2
    )
    with pytest.raises(SourceLogChangedError):
        lost_again.initialize_transaction(3, second)


def test_a_transactional_replay_reads_its_offsets_only_from_the_log_they_were_recorded_on():
    old = {"words-0": _log("old", 10)}
    stored = _source(KafkaSource, {"words-0": (0, 10)}, old).initialize_transaction(1, None)
    same = _source(KafkaSource, {"words-0": (0, 12)}, {"words-0": _log("old", 12)})
    assert same.replay_metadata(1, stored, None) is stored
    refilled = {"words-0": _log("new", 12)}
    with pytest.raises(SourceLogChangedError) as raised:
        _source(KafkaSource, {"words-0": (0, 12)}, refilled).replay_metadata(1, stored, None)
    assert raised.value.partition == "words-0"
    # declared: the replay starts again on the new log (a new batch, recorded at this attempt)
    reset = _source(KafkaSource, {"words-0": (0, 12)}, refilled, reset_log_from_txid=1)
    replayed_1 = reset.replay_metadata(1, stored, None)
    assert offset_ranges(replayed_1) == {"words-0": [0, 12]} and RESET in replayed_1
    # once replayed on the new log, its own anchors are after the reset: a later loss is refused
    third = _source(
        KafkaSource, {"words-0": (0, 12)}, {"words-0": _log("3rd", 12)}, reset_log_from_txid=1
    )
    with pytest.raises(SourceLogChangedError):
        third.replay_metadata(1, replayed_1, None)
    second = _source(KafkaSource, {"words-0": (0, 15)}, {"words-0": _log("old", 15)})
    stored_2 = second.initialize_transaction(2, stored)
    declared = _source(
        KafkaSource, {"words-0": (0, 12)}, {"words-0": _log("new", 12)}, reset_log_from_txid=2
    )
    replayed = declared.replay_metadata(2, stored_2, stored)
    assert offset_ranges(replayed) == {"words-0": [0, 12]} and replayed[RESET] == {
        "words-0": [10, 0]
    }


def test_after_a_rewind_to_the_reset_txid_the_later_txids_begun_on_the_old_log_start_again():
    """Rewound to txid 1 with the reset declared there: txid 1 starts again on the new log, and
    txid 2, begun on the old log after txid 1's old batch, no longer follows it: the reset
    covers it (it re-reads from txid 1's new end), however its own anchors were taken. Once
    the txids follow each other on the new log, a later loss is refused again."""
    old = _source(KafkaSource, {"words-0": (0, 10)}, {"words-0": _log("old", 10)})
    stored_1 = old.initialize_transaction(1, None)
    grown = _source(KafkaSource, {"words-0": (0, 14)}, {"words-0": _log("old", 14)})
    stored_2 = grown.initialize_transaction(2, stored_1)  # [10, 14) of the old log
    new_log = {"words-0": _log("new", 30)}
    reset = _source(
        KafkaSource, {"words-0": (0, 30)}, new_log, reset_log_from_txid=1, max_per_partition=20
    )
    replayed_1 = reset.replay_metadata(1, stored_1, None)
    assert offset_ranges(replayed_1) == {"words-0": [0, 20]}
    replayed_2 = reset.replay_metadata(2, stored_2, replayed_1)
    assert offset_ranges(replayed_2) == {"words-0": [20, 30]}
    assert replayed_2[RESET] == {"words-0": [10, 20]}
    # without the reset, txid 2's old batch is refused like any other
    with pytest.raises(SourceLogChangedError):
        _source(KafkaSource, {"words-0": (0, 30)}, new_log).replay_metadata(2, stored_2, replayed_1)
    # txid 3 begun on the new log follows txid 2: a loss after the reset is refused again
    more = _source(KafkaSource, {"words-0": (0, 35)}, {"words-0": _log("new", 35)})
    stored_3 = more.initialize_transaction(3, replayed_2)
    lost_again = _source(
        KafkaSource, {"words-0": (0, 40)}, {"words-0": _log("third", 40)}, reset_log_from_txid=1
    )
    with pytest.raises(SourceLogChangedError):
        lost_again.replay_metadata(3, stored_3, replayed_2)


def test_a_txid_of_an_older_version_without_an_identity_is_read_as_before():
    source = _source(KafkaSource, {"words-0": (0, 12)}, {"words-0": _log("x", 12)})
    assert offset_ranges(source.initialize_transaction(2, {"words-0": [0, 10]})) == {
        "words-0": [10, 12]
    }
    assert source.replay_metadata(2, {"words-0": [0, 10]}, None) == {"words-0": [0, 10]}


def test_the_reset_txid_must_be_a_txid():
    with pytest.raises(ValueError, match="reset_log_from_txid must be >= 1"):
        KafkaSource("words", reset_log_from_txid=0)


def test_spark_s_kafka_reader_reads_committed_records_only(monkeypatch):
    """``reader="spark"`` passes ``kafka.isolation.level=read_committed``, whatever the
    connection says, as the default reader does."""
    monkeypatch.setattr(
        "airflow_txn_provider.sources.kafka.kafka_config",
        lambda conn_id: {"bootstrap.servers": "127.0.0.1:1", "isolation.level": "read_uncommitted"},
    )

    class Reader:
        def __init__(self):
            self.single = {}

        def format(self, name):
            assert name == "kafka"
            return self

        def options(self, **kw):
            self.options_given = kw
            return self

        def option(self, key, value):
            self.single[key] = value
            return self

        def load(self):
            return {**self.options_given, **self.single}

    class Spark:
        read = Reader()

    source = KafkaSource("words", reader="spark")
    loaded = source.read_batch(Spark(), {"words-0": [0, 5]})
    assert loaded["kafka.isolation.level"] == "read_committed"
    assert loaded["failOnDataLoss"] == "true"
