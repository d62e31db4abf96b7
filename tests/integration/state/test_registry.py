"""The state registry (state/registry.py) on a real Postgres: a state belongs to one pipeline and
keeps its definition, is read back by name or pipeline, and is recorded as one of its outputs."""

from __future__ import annotations

import pytest

from airflow_txn_provider.log.outputs import read_outputs
from airflow_txn_provider.rules.exceptions import OutputStartRequiredError, StateDefinitionError
from airflow_txn_provider.rules.sources import TransactionalSource
from airflow_txn_provider.rules.vocabulary import StateKind
from airflow_txn_provider.state.registry import named, of_pipeline, register_state, registered

WORDS = {"keys": {"word": "text"}, "value_type": "bigint"}
PAGES = {"keys": {"page": "text"}, "value_type": "bigint"}


def test_a_state_is_registered_once_and_read_back_by_name_and_by_pipeline(engine):
    with engine.begin() as conn:
        register_state(conn, "words", "p", StateKind.TRANSACTIONAL, WORDS)
        register_state(conn, "words", "p", StateKind.TRANSACTIONAL, WORDS)  # again: the same
        register_state(conn, "pages", "p", StateKind.OPAQUE, PAGES)
        register_state(conn, "hits", "q", StateKind.OPAQUE, PAGES)
    assert registered(engine, named("words")) == [("p", "words", WORDS)]
    with engine.connect() as conn:
        assert registered(conn, of_pipeline("p")) == [("p", "pages", PAGES), ("p", "words", WORDS)]
        assert registered(conn, named("nothing")) == []
        recorded = read_outputs(conn, "p")
    assert {n: (r.kind.value, r.complete_from_txid) for n, r in recorded.items()} == {
        "pages": ("state", 1),
        "words": ("state", 1),
    }


@pytest.mark.parametrize(
    ("pipeline", "definition", "said"),
    [
        ("q", WORDS, "of pipeline 'p'; declared as .* of pipeline 'q'"),
        ("p", PAGES, r"exists as \{.*'word'.*\} of pipeline 'p'; declared as \{.*'page'"),
    ],
    ids=["another pipeline", "another definition"],
)
def test_a_declaration_that_contradicts_the_registered_state_is_refused(
    engine, pipeline, definition, said
):
    with engine.begin() as conn:
        register_state(conn, "words", "p", StateKind.TRANSACTIONAL, WORDS)
    with pytest.raises(StateDefinitionError, match=said) as err, engine.begin() as conn:
        register_state(conn, "words", pipeline, StateKind.TRANSACTIONAL, definition)
    assert err.value.pipeline == pipeline
    assert registered(engine, named("words")) == [("p", "words", WORDS)]  # as it was


class Steps(TransactionalSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


def test_a_state_new_to_a_pipeline_that_has_begun_txids_says_how_it_starts(txlog):
    txlog.register_pipeline("p", source_kind="transactional", max_pending=2)
    assert txlog.begin("p", 1, Steps()).emitted
    with pytest.raises(OutputStartRequiredError) as err, txlog.engine.begin() as conn:
        register_state(conn, "late", "p", StateKind.TRANSACTIONAL, WORDS)
    assert err.value.output == "late"
    assert registered(txlog.engine, named("late")) == []  # its transaction rolled back
    with txlog.engine.begin() as conn:
        register_state(conn, "late", "p", StateKind.TRANSACTIONAL, WORDS, start="next_txid")
    with txlog.engine.connect() as conn:
        assert read_outputs(conn, "p")["late"].complete_from_txid == 2
    assert registered(txlog.engine, of_pipeline("p")) == [("p", "late", WORDS)]
