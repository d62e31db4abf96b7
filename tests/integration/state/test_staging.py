"""Every key and value stored exactly, or refused before staging with a typed error (issue 25), on
a real Postgres: Hypothesis draws keys from all of Unicode text (carriage returns, line feeds,
tabs, quotes, backslashes, commas, empty, very long, NUL) and deltas up to the type's bounds,
through both staging paths (Python rows and Arrow), and the committed state must equal a
plain-Python model exactly, or the batch is refused and nothing is staged."""

from __future__ import annotations

import itertools
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_txn_provider.rules.exceptions import MalformedOutputError, StateValueOutOfRangeError
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import MapState
from airflow_txn_provider.state.staging import KEY_BYTES_LIMIT
from airflow_txn_provider.transactions.commit import commit_states

BIG = 2**63 - 1
_names = itertools.count()


class Batches(TransactionalSource):
    def initialize_transaction(self, txid, prev_metadata):
        return {"txid": txid}


def _pipeline(txlog, **state_kw):
    name = f"dom_{next(_names)}"
    txlog.register_pipeline(name, source_kind="transactional", max_pending=2)
    state = MapState(name, name, **state_kw).create(txlog.engine)
    return name, state


def _commit_batch(txlog, pipeline, state, txid, batch, path):
    """Stage ``batch`` by ``path`` (rows or arrow) and commit it."""
    attempt = txlog.begin(pipeline, txid, Batches()).attempt

    def stage(conn):
        if path == "rows":
            return {state.output_key: state.stage(conn, txid, attempt, batch)}
        columns = list(zip(*batch, strict=True)) if batch else [[] for _ in (*state.keys, 0)]
        types = {"text": pa.string(), "bigint": pa.int64()}
        table = pa.table(
            {
                **{
                    c: pa.array(columns[i], types[t]) for i, (c, t) in enumerate(state.keys.items())
                },
                "delta": pa.array(columns[-1], types[state.value_type]),
            }
        )
        return {state.output_key: state.stage_arrow(conn, txid, attempt, table)}

    txlog.stage_output(pipeline, txid, attempt, stage)
    return commit_states(txlog, pipeline, txid, attempt, [state]), attempt


KEYS = st.text(max_size=30) | st.sampled_from(
    ["\r", "\n", "\r\n", "a\rb", "x\r\n", '"', "\\", ",", "", "\t"]
)
BATCH = st.lists(st.tuples(KEYS, st.integers(-(2**40), 2**40)), max_size=30)


@pytest.mark.parametrize("path", ["rows", "arrow"])
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(BATCH, min_size=1, max_size=3))
def test_any_unicode_key_is_stored_exactly_or_refused_with_nothing_staged(txlog, path, batches):
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    model: Counter[str] = Counter()
    for txid, batch in enumerate(batches, start=1):
        refused = any("\x00" in w for w, _ in batch)
        if refused:
            with pytest.raises(MalformedOutputError, match="NUL") as err:
                _commit_batch(txlog, pipeline, state, txid, batch, path)
            assert (err.value.pipeline, err.value.txid, err.value.state) == (
                pipeline,
                txid,
                state.name,
            )
            info = txlog.transaction(pipeline, txid)
            with txlog.engine.connect() as conn:
                assert state.staged(conn, txid, info.attempt) == []
            # Nothing lost: the txid is still there to replay (here: without the bad key).
            batch = [(w, d) for w, d in batch if "\x00" not in w]
            txlog.fail(pipeline, txid, info.attempt, error="bad key")
        _commit_batch(txlog, pipeline, state, txid, batch, path)
        for word, delta in batch:
            model[word] += delta
    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
    assert got == dict(model)


@pytest.mark.parametrize("path", ["rows", "arrow"])
def test_the_keys_text_round_trips_broke_are_stored_as_given(txlog, path):
    keys = ["a\rb", "x\r\n", "\r", "\n", "tab\there", 'q"uote', "back\\slash", "com,ma", "", "é€😀"]
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    _commit_batch(txlog, pipeline, state, 1, [(k, i + 1) for i, k in enumerate(keys)], path)
    with txlog.engine.connect() as conn:
        assert {k[0]: v for k, v in state.items(conn).items()} == {
            k: i + 1 for i, k in enumerate(keys)
        }


@pytest.mark.parametrize("path", ["rows", "arrow"])
def test_a_key_over_the_limit_is_refused_before_staging(txlog, path):
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    long = "k" * 20_000  # passed staging, then failed the commit with a raw btree error
    with pytest.raises(MalformedOutputError, match=f"over {KEY_BYTES_LIMIT} UTF-8 bytes") as err:
        _commit_batch(txlog, pipeline, state, 1, [("ok", 1), (long, 1)], path)
    assert err.value.txid == 1 and err.value.state == state.name
    # At the limit, multi-byte characters counted as bytes, it is stored whole.
    edge = "é" * (KEY_BYTES_LIMIT // 2)
    txlog.fail(pipeline, 1, error="too long")
    _commit_batch(txlog, pipeline, state, 1, [(edge, 1)], path)
    with txlog.engine.connect() as conn:
        assert state.items(conn) == {(edge,): 1}


@pytest.mark.parametrize(
    ("delta", "problem"),
    [
        (2.5, "not an integer"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (2**63, "out of bigint's range"),
        ("3", "is a str, not a number"),
        (True, "is a bool, not a number"),
    ],
)
def test_a_delta_of_the_wrong_type_is_refused_not_rounded(txlog, delta, problem):
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    with pytest.raises(MalformedOutputError, match=problem):
        _commit_batch(txlog, pipeline, state, 1, [("a", 1), ("b", delta)], "rows")
    txlog.fail(pipeline, 1, error="bad delta")
    _commit_batch(txlog, pipeline, state, 1, [("a", 2.0)], "rows")  # integral: an integer
    with txlog.engine.connect() as conn:
        assert state.items(conn) == {("a",): 2}


def test_an_arrow_float_delta_into_an_integer_state_is_refused_when_fractional(txlog):
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    attempt = txlog.begin(pipeline, 1, Batches()).attempt
    table = pa.table({"word": ["a", "b"], "delta": [1.0, 0.5]})
    with pytest.raises(MalformedOutputError, match=r"0\.5 is not an integer") as err:
        with txlog.engine.begin() as conn:
            state.stage_arrow(conn, 1, attempt, table)
    assert "'b'" in (err.value.row or "")


@pytest.mark.parametrize("path", ["rows", "arrow"])
def test_a_batch_that_overflows_alone_is_refused_naming_the_key(txlog, path):
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    with pytest.raises(MalformedOutputError, match="out of bigint's range") as err:
        _commit_batch(txlog, pipeline, state, 1, [("a", 1), ("big", BIG), ("big", 1)], path)
    assert "big" in (err.value.row or "")


def test_a_sum_that_leaves_the_range_at_commit_fails_the_txid_at_once(txlog):
    """It was a raw DataError (a permanent error) at commit; now a typed one naming the key,
    and the txid fails through the cascade, with nothing applied."""
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    _commit_batch(txlog, pipeline, state, 1, [("big", BIG - 5), ("small", 1)], "rows")
    with pytest.raises(StateValueOutOfRangeError, match="'big'") as err:
        _commit_batch(txlog, pipeline, state, 2, [("big", 10), ("small", 1)], "rows")
    assert (err.value.txid, err.value.state) == (2, state.name)
    assert txlog.transaction(pipeline, 2).status is TxStatus.FAILED
    assert "out of bigint's range" in txlog.transaction(pipeline, 2).last_error
    with txlog.engine.connect() as conn:
        assert state.items(conn) == {("big",): BIG - 5, ("small",): 1}


def test_a_spark_jobs_arrow_result_keeps_every_key_exactly(txlog, spark):
    """The Arrow path as a Spark job takes it: ``DataFrame.toArrow()`` of a word count over
    lines split from Windows text."""
    from pyspark.sql import functions as F

    lines = ["alpha\r\nbeta", "a\rb,c", 'quote"d \\back', "", "é\t€"]
    frame = spark.createDataFrame([(line,) for line in lines], "line STRING")
    counts = (
        frame.select(F.explode(F.split("line", " ")).alias("word"))
        .groupBy("word")
        .agg(F.count("*").alias("delta"))
    )
    pipeline, state = _pipeline(txlog, keys={"word": "text"})
    attempt = txlog.begin(pipeline, 1, Batches()).attempt
    txlog.stage_output(
        pipeline,
        1,
        attempt,
        lambda c: {state.output_key: state.stage_arrow(c, 1, attempt, counts.toArrow())},
    )
    commit_states(txlog, pipeline, 1, attempt, [state])
    expected = Counter(word for line in lines for word in line.split(" "))
    with txlog.engine.connect() as conn:
        assert {k[0]: v for k, v in state.items(conn).items()} == dict(expected)
