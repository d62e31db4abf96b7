"""Domain errors keep what they say across pickling (Airflow and multiprocessing pickle them)."""

from __future__ import annotations

import pickle

import pytest

from airflow_txn_provider.rules.exceptions import (
    InvalidNameError,
    MalformedOutputError,
    MalformedRecordError,
    NotBegunError,
    StateValueOutOfRangeError,
)


@pytest.mark.parametrize(
    "error",
    [
        NotBegunError("z", pipeline="p", txid=1),
        InvalidNameError("a bad name"),
        MalformedRecordError("bad JSON", pipeline="p", txid=1, attempt=2, location="f.jsonl:3"),
        MalformedOutputError("null key", pipeline="p", txid=1, state="words", row="(None, 1)"),
        StateValueOutOfRangeError("overflow", txid=3, state="words", key="('a',)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_survives_pickling_whole(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert vars(again) == vars(error)


def test_the_fields_an_error_says_more_with():
    error = MalformedRecordError("bad JSON", pipeline="p", txid=1, location="f.jsonl:3")
    assert str(error).endswith("bad JSON at f.jsonl:3") and error.detail == "bad JSON"
    assert MalformedOutputError("x").state is None
    with pytest.raises(TypeError, match="location"):
        NotBegunError("z", location="nowhere")


def test_an_error_a_source_raised_names_the_pipeline_it_was_raised_for():
    raised = MalformedRecordError("bad JSON", txid=1, location="f.jsonl:3")
    named = raised.naming("p", 7, attempt=2)
    assert type(named) is MalformedRecordError and named.location == "f.jsonl:3"
    assert (named.pipeline, named.txid, named.attempt, named.detail) == ("p", 7, 2, "bad JSON")
    assert str(named) == "pipeline=p txid=7 attempt=2: bad JSON at f.jsonl:3"
