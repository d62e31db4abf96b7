"""Which states a processed txid's output counts (issue 28: the rule in one place, read by the
processing job and by the record of several jobs' output)."""

from __future__ import annotations

import airflow_txn_provider.state.maps as maps
from airflow_txn_provider.state import BucketCountState, GlobalState, MapState, counted_states


def test_every_state_but_a_derived_one_is_counted_by_its_output_key(monkeypatch):
    words = MapState("p", "words", keys={"word": "text"})
    total = GlobalState("p", "total")
    buckets = BucketCountState("p", "buckets", of="words")
    loaded = {s.name: s for s in (words, total, buckets)}
    monkeypatch.setattr(maps, "load_states", lambda bind, pipeline: loaded)
    counted = counted_states(None, "p")
    assert counted == {words.output_key: words, total.output_key: total}
