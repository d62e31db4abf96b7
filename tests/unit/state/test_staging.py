"""The binary COPY encoder of Arrow columns writes exactly what psycopg's own ``write_row``
writes, value by value (its reference), for any Unicode text and the int64 / float64 ranges."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_txn_provider.state.staging import encode_binary_copy


def _reference(rows, types) -> bytes:
    """psycopg's binary COPY bytes of ``rows``, value by value: the formatter its ``Copy`` uses
    (a private module of psycopg, used by this test only), with the global adapters and no
    connection."""
    from psycopg import postgres
    from psycopg._copy_base import BinaryFormatter
    from psycopg.adapt import Transformer
    from psycopg.pq import Format

    transformer = Transformer(None)
    transformer.set_dumper_types([postgres.types[t].oid for t in types], Format.BINARY)
    formatter = BinaryFormatter(transformer)
    out = bytearray()
    for row in rows:
        out += formatter.write_row(row)
    out += formatter.end()
    return bytes(out)


ROWS = st.lists(
    st.tuples(
        st.text(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, chunk=st.integers(1, 7))
def test_the_encoding_equals_psycopgs_row_by_row(rows, chunk):
    table = pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "x": pa.array([r[2] for r in rows], pa.float64()),
        }
    )
    encoded = b"".join(encode_binary_copy(table, chunk_rows=chunk))
    assert encoded == _reference(rows, ["text", "int8", "float8"])


@pytest.mark.parametrize("string", [pa.string(), pa.large_string()])
def test_a_sliced_chunked_table_encodes_only_its_rows(string):
    whole = pa.table({"k": pa.array(["a\\r", "bé", "", "c\\n"], string), "n": [1, 2, 3, 4]})
    table = pa.concat_tables([whole.slice(1, 2), whole.slice(3, 1)])
    rows = [("bé", 2), ("", 3), ("c\\n", 4)]
    assert b"".join(encode_binary_copy(table)) == _reference(rows, ["text", "int8"])
