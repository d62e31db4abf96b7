"""The lake sinks' schema check: whether a batch's columns match its table's.

Both the processing job (before recording an attempt) and the commit (before adding its files)
check, with the same rule: column names and types, order aside, string flavours as one type.
A mismatch is refused with :class:`LakeSchemaMismatchError`, naming each column that differs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_txn_provider.rules.exceptions import LakeSchemaMismatchError

if TYPE_CHECKING:
    import pyarrow as pa


def _canonical(t: pa.DataType) -> str:
    """A column type as both formats and Spark agree on it (string flavours are one type)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _canonical(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{_canonical(t.value_type)}>"
    if pa.types.is_struct(t):
        inner = ", ".join(
            f"{t.field(i).name}: {_canonical(t.field(i).type)}" for i in range(t.num_fields)
        )
        return f"struct<{inner}>"
    if pa.types.is_map(t):
        return f"map<{_canonical(t.key_type)}, {_canonical(t.item_type)}>"
    return str(t)


def schema_problems(table: pa.Schema, batch: pa.Schema) -> list[str]:
    """How the batch's columns differ from the table's (order aside); empty when they match."""
    have = {f.name: _canonical(f.type) for f in batch}
    want = {f.name: _canonical(f.type) for f in table}
    problems = [f"missing column {c!r} ({want[c]})" for c in want if c not in have]
    problems += [f"extra column {c!r} ({have[c]})" for c in have if c not in want]
    problems += [
        f"column {c!r} is {have[c]}, the table has {want[c]}"
        for c in want
        if c in have and have[c] != want[c]
    ]
    return problems


def check_schema(
    table: pa.Schema, batch: pa.Schema, *, sink: str, pipeline: str, txid: int, attempt: int
) -> None:
    problems = schema_problems(table, batch)
    if problems:
        raise LakeSchemaMismatchError(
            f"lake sink {sink!r}: the batch does not match the table's schema: "
            + "; ".join(problems),
            pipeline=pipeline,
            txid=txid,
            attempt=attempt,
        )


__all__ = ["check_schema", "schema_problems"]
