"""Declaring a pipeline's outputs (transactions/declaration.py), with plain values: the
declaration's choices on ``TxnPipeline`` and in its fingerprint (issue 46)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.vocabulary import OutputRetirement, OutputStart
from airflow_txn_provider.sinks import DeltaSink
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.declaration import declaration_fingerprint

DROP, NEXT = OutputRetirement.DROP, OutputStart.NEXT_TXID


def pipeline(**kw):
    states = [MapState("p", "a", keys={"k": "text"}), MapState("p", "b", keys={"k": "text"})]
    return TxnPipeline(name="p", source=GeneratedTextSource(), jobs=["j.py"], states=states, **kw)


def test_the_pipeline_checks_its_output_choices():
    p = pipeline(start={"b": "next_txid"}, retired={"old": "drop"})
    assert p.start == {"b": NEXT} and p.retired == {"old": DROP}
    with pytest.raises(ValueError, match=r"start= names \['c'\]"):
        pipeline(start={"c": "next_txid"})
    with pytest.raises(ValueError, match=r"\['a'\] both declared and retired"):
        pipeline(retired={"a": "keep"})
    with pytest.raises(
        ValueError, match=r"start takes \{output name: one of \['next_txid', 'history'\]\}"
    ):
        pipeline(start={"b": "fill_history"})
    with pytest.raises(ValueError, match=r"retired takes .*\['keep', 'drop'\]"):
        pipeline(retired={"old": "archive"})


def test_the_fingerprint_covers_the_sinks_and_the_choices():
    states = pipeline().states
    sink = DeltaSink("t", table_uri="/lake/t")

    def fp(**kw):
        return declaration_fingerprint("transactional", 4, "d", states, **kw)

    assert fp() == fp(sinks=(), start={}, retired={})
    assert (
        len({fp(), fp(sinks=[sink]), fp(start={"b": "next_txid"}), fp(retired={"c": "keep"})}) == 4
    )
    assert fp(start={"b": "next_txid"}) == fp(start={"b": NEXT})
