"""The lake sinks' schema check (sinks/schema.py): column names and types, order aside, string
flavours as one type."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_txn_provider.rules.exceptions import LakeSchemaMismatchError
from airflow_txn_provider.sinks.schema import check_schema, schema_problems


class TestSchemaCheck:
    TABLE = pa.schema(
        [("word", pa.string()), ("delta", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))]
    )

    def test_string_flavours_and_column_order_do_not_matter(self):
        batch = pa.schema(
            [
                ("at", pa.timestamp("us", tz="UTC")),
                ("delta", pa.int64()),
                ("word", pa.large_string()),
            ]
        )
        assert schema_problems(self.TABLE, batch) == []

    def test_missing_extra_and_retyped_columns_are_each_named(self):
        batch = pa.schema([("word", pa.string()), ("delta", pa.int32()), ("txid", pa.int64())])
        problems = schema_problems(self.TABLE, batch)
        assert problems == [
            "missing column 'at' (timestamp with time zone)",
            "extra column 'txid' (int64)",
            "column 'delta' is int32, the table has int64",
        ]
        with pytest.raises(LakeSchemaMismatchError, match="pipeline=p txid=3 attempt=1"):
            check_schema(self.TABLE, batch, sink="s", pipeline="p", txid=3, attempt=1)

    def test_a_timestamp_without_zone_is_not_one_with(self):
        batch = pa.schema(
            [("word", pa.string()), ("delta", pa.int64()), ("at", pa.timestamp("us"))]
        )
        assert schema_problems(self.TABLE, batch) == [
            "column 'at' is timestamp, the table has timestamp with time zone"
        ]
