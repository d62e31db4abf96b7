"""A map state's summary (state/summary.py) on a real Postgres: the key count and value sum each
commit keeps equal a scan of the table."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from airflow_txn_provider.state import MapState


@pytest.mark.parametrize("kind", ["transactional", "opaque", "non_transactional"])
def test_the_kept_summary_equals_a_scan_after_every_commit(engine, kind):
    """The key count and sum each commit keeps (what the Transactions page shows) stay equal to
    a scan of the table through new keys, updates, opaque replays of a txid and repeats."""
    import random

    seed_ = 2026
    print(f"seed {seed_}")
    rng = random.Random(seed_)
    words = MapState("p", f"sum_{kind}", kind, keys={"word": "text"}).create(engine)
    txid = 0
    for _ in range(40):
        replay = txid > 0 and kind != "transactional" and rng.random() < 0.3
        txid = txid if replay else txid + 1
        batch = [(rng.choice("abcdefghij"), rng.randint(-3, 9)) for _ in range(rng.randint(1, 6))]
        with engine.begin() as conn:
            words.stage(conn, txid, 1, batch)
            words.apply(conn, txid, 1)
        with engine.connect() as conn:
            scanned = conn.execute(
                text(f"SELECT count(*), coalesce(sum(value), 0) FROM {words.table}")
            ).one()
            assert words.summary(conn) == (scanned[0], scanned[1]), (txid, replay, batch)
