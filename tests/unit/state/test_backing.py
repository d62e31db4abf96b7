"""A state's tables (state/backing.py), without a database: the names and key columns a state
table may not take, and its keys quoted in every statement (issue 11)."""

from __future__ import annotations

import pytest

from airflow_txn_provider.log.models import Base
from airflow_txn_provider.log.schema import VERSION_TABLE
from airflow_txn_provider.state import BucketCountState, GlobalState, MapState


@pytest.mark.parametrize("table", sorted([*Base.metadata.tables, VERSION_TABLE]))
def test_no_state_name_makes_a_table_of_the_log(table):
    """``registry`` made ``txn_state_registry``: the log's own table, then every commit failed."""
    for prefix in ("txn_state_", "txn_stage_"):
        if table.startswith(prefix):
            name = table[len(prefix) :]
            with pytest.raises(ValueError, match=f"{table}.*transaction log's own"):
                MapState("p", name, keys={"k": "text"})
            with pytest.raises(ValueError, match=table):
                GlobalState("p", name)
            with pytest.raises(ValueError, match=table):
                BucketCountState("p", name, of="other")


def test_registry_is_refused_as_a_state_name():
    with pytest.raises(ValueError, match="txn_state_registry"):
        MapState("p", "registry", keys={"k": "text"})


@pytest.mark.parametrize("column", ["user", "order", "offset", "end", "select", "group"])
def test_reserved_words_are_quoted_in_every_statement(column):
    state = MapState("p", "s", keys={column: "text", "k2": "bigint"})
    assert state.quoted_keys == [f'"{column}"', '"k2"']


def test_a_key_column_cannot_take_the_stage_job_column_name():
    with pytest.raises(ValueError, match="reserved"):
        MapState("p", "s", keys={"stage_job": "text"})
