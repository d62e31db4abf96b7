"""The log trigger's events (issue 28): one typed event whose payload is the dict Airflow stores
(the same keys and values as before, so a trigger persisted by a running Airflow still resumes
its task), read back and checked where the task resumes."""

from __future__ import annotations

import itertools
import json
import pickle

import pytest

from airflow_txn_provider.dag_builder import build_dag
from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.exceptions import MalformedEventError
from airflow_txn_provider.rules.vocabulary import EventState
from airflow_txn_provider.rules.waiting import ATTEMPT_NEEDED, TxnEvent
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.state import MapState


@pytest.mark.parametrize("state", list(EventState))
def test_every_event_survives_its_payload(state):
    attempts = [2] if state in ATTEMPT_NEEDED else [None, 2]
    txids = [None, 7] if state is EventState.MANUAL_RUN else [7]
    for attempt, txid in itertools.product(attempts, txids):
        event = TxnEvent(state, attempt, txid)
        payload = json.loads(json.dumps(event.to_payload()))  # what Airflow stores
        assert TxnEvent.from_payload(payload) == event
        assert payload["state"] == state.value and type(payload["state"]) is str


def test_the_payload_is_the_one_the_trigger_always_fired():
    assert TxnEvent(EventState.FAILED, 2, 3).to_payload() == {
        "state": "failed",
        "attempt": 2,
        "txid": 3,
    }
    assert list(TxnEvent(EventState.OPEN, 1, 3).to_payload()) == ["state", "attempt", "txid"]
    assert TxnEvent(EventState.OPEN, txid=2).to_payload() == {"state": "open", "txid": 2}
    assert TxnEvent(EventState.MANUAL_RUN).to_payload() == {"state": "manual_run"}
    assert {s.value for s in EventState} == {
        "can_begin",
        "open",
        "committed",
        "stale",
        "unfinished",
        "failed",
        "not_requeued",
        "lease_expired",
        "manual_run",
        "alert",
    }


def test_keys_it_does_not_know_are_ignored():
    event = TxnEvent.from_payload({"state": "committed", "txid": 3, "later": "x"})
    assert event == TxnEvent(EventState.COMMITTED, txid=3)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"state": "exploded", "txid": 3}, "unknown state 'exploded'"),
        ({"txid": 3}, "unknown state None"),
        ({"state": ["failed"], "txid": 3}, "unknown state"),
        ({"state": "failed", "attempt": 1}, "no txid"),
        ({"state": "failed", "txid": "3"}, "txid '3' is not an integer"),
        ({"state": "failed", "txid": 3.0}, "txid 3.0 is not an integer"),
        ({"state": "failed", "txid": True}, "txid True is not an integer"),
        ({"state": "failed", "txid": 3, "attempt": "1"}, "attempt '1' is not an integer"),
        ({"state": "lease_expired", "txid": 3}, "a lease_expired event names no attempt"),
        ({"state": "alert", "txid": 3}, "a alert event names no attempt"),
    ],
)
def test_a_malformed_payload_is_refused_naming_pipeline_and_txid(payload, problem):
    with pytest.raises(MalformedEventError, match=problem) as refused:
        TxnEvent.from_payload(payload, pipeline="words")
    error = refused.value
    assert error.pipeline == "words"
    assert error.txid == (payload["txid"] if type(payload.get("txid")) is int else None)
    assert str(error).startswith(f"pipeline=words txid={error.txid} ")
    assert pickle.loads(pickle.dumps(error)).txid == error.txid  # Airflow pickles errors


@pytest.mark.parametrize("payload", [None, "failed", ["failed", 3]])
def test_a_payload_that_is_no_mapping_is_refused(payload):
    with pytest.raises(MalformedEventError, match="is not a mapping"):
        TxnEvent.from_payload(payload, pipeline="words")


# -- the resume sites: a malformed event fails the task before it touches the log ---------------


def _dag(jobs=("spark_jobs/word_count.py",)):
    return build_dag(
        TxnPipeline(
            name="words",
            source=PartitionedParquetSource("/data/words"),
            jobs=jobs,
            states=[MapState("words", "word_counts", keys={"word": "text"})],
        )
    )


BAD = {"state": "failed", "txid": "3"}


def _refuses(resume, *args):
    with pytest.raises(MalformedEventError, match="pipeline=words") as refused:
        resume({}, *args)  # an empty context: nothing is read before the event
    assert "txid '3' is not an integer" in str(refused.value)


def test_the_failure_sensor_refuses_a_malformed_event():
    _refuses(_dag().get_task("watch_failures").on_failure, BAD)


def test_the_commit_refuses_a_malformed_event():
    _refuses(_dag().get_task("commit").execute_complete, BAD)


def test_a_claim_refuses_a_malformed_event_but_not_the_no_data_timers_moment():
    import pendulum

    one = _dag().get_task("process_word_count")
    _refuses(one.execute, BAD)
    begin = _dag(jobs=("spark_jobs/word_count.py", "spark_jobs/line_lengths.py")).get_task("begin")
    _refuses(begin.execute, BAD)
    assert begin.resumed_with(None) is None  # a first start
    assert begin.resumed_with(pendulum.now("UTC")) is None  # TimeDeltaTrigger's event
    assert begin.resumed_with({"state": "can_begin", "txid": 3}) == TxnEvent(
        EventState.CAN_BEGIN, txid=3
    )
