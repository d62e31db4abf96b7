"""Staging a batch of partial results: the value domain checked, then one binary ``COPY``.

The ``COPY`` (psycopg 3) takes Python rows and Arrow tables alike, with no text round trip, so
every key is stored exactly as given. A batch outside the value domain (README, "Keys and
values") is refused whole, before anything is staged, with
:class:`~airflow_txn_provider.rules.exceptions.MalformedOutputError` naming its first bad row:
a null key; a text key with a NUL or over :data:`KEY_BYTES_LIMIT` UTF-8 bytes (a btree entry's
cap); a null delta, or one the state's type cannot hold exactly (a fraction, an out-of-range
integer, NaN or an infinity for an integer state; NaN or an infinity for any); with ``sum``, a
key whose deltas already sum out of an integer type's range. A sum out of range only with the
committed value fails at commit
(:class:`~airflow_txn_provider.rules.exceptions.StateValueOutOfRangeError`, permanent).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from airflow_txn_provider.compat.python import fromisoformat

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.state.maps import MapState

KEY_BYTES_LIMIT = 2000
"""UTF-8 bytes of a key's text columns, together, that a state accepts."""
INTEGER_BITS = {"bigint": 64, "integer": 32, "smallint": 16}
COPY_TYPES = {
    # SQL type: the type name psycopg's binary COPY writes it as
    "text": "text",
    "bigint": "int8",
    "integer": "int4",
    "smallint": "int2",
    "boolean": "bool",
    "date": "date",
    "timestamptz": "timestamptz",
    "numeric": "numeric",
    "double precision": "float8",
}
STAGE_JOB_COLUMN = "stage_job"
"""Column of a staging table naming the job that staged a row: several jobs of one txid may
stage into the same state, and each replaces only its own rows."""


class Refused(Exception):
    """A batch outside the value domain: ``problem``, and the row (``None``: not one row)."""

    def __init__(self, problem: str, row: Sequence[Any] | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.row = None if row is None else tuple(row)


def integer_range(sql_type: str) -> tuple[int, int] | None:
    bits = INTEGER_BITS.get(sql_type)
    return None if bits is None else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


# -- one value -------------------------------------------------------------------------------


def key_value(column: str, sql_type: str, value: Any) -> Any:
    """``value`` as the key column's binary COPY writes it; raises :class:`Refused`."""
    if value is None:
        raise Refused(f"key {column} is null")
    if sql_type == "text":
        if not isinstance(value, str):
            raise Refused(f"key {column} is a {type(value).__name__}, not text")
        if "\x00" in value:
            raise Refused(f"key {column} holds NUL (\\x00), which Postgres text cannot store")
        return value
    if sql_type in INTEGER_BITS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(f"key {column} is a {type(value).__name__}, not an integer")
        low, high = integer_range(sql_type) or (0, 0)
        if not low <= value <= high:
            raise Refused(f"key {column} {value} is out of {sql_type}'s range")
        return value
    if sql_type == "boolean":
        if not isinstance(value, bool):
            raise Refused(f"key {column} is a {type(value).__name__}, not a boolean")
        return value
    if sql_type == "date":
        if isinstance(value, str):
            value = _parsed(column, value, date.fromisoformat)
        if isinstance(value, datetime) or not isinstance(value, date):
            raise Refused(f"key {column} is a {type(value).__name__}, not a date")
        return value
    if sql_type == "timestamptz":
        if isinstance(value, str):
            value = _parsed(column, value, fromisoformat)
        if not isinstance(value, datetime):
            raise Refused(f"key {column} is a {type(value).__name__}, not a timestamp")
        if value.tzinfo is None:
            raise Refused(f"key {column} {value.isoformat()} has no time zone")
        return value
    number = _number(f"key {column}", value)
    if sql_type == "double precision":
        return float(number)
    return number if isinstance(number, Decimal) else Decimal(repr(number))


def delta_value(value_type: str, value: Any) -> Any:
    """``value`` as a delta of a ``value_type`` state; raises :class:`Refused`."""
    if value is None:
        raise Refused("delta is null")
    number = _number("delta", value)
    bounds = integer_range(value_type)
    if bounds is not None:
        if not isinstance(number, int):
            integral = (
                number == number.to_integral_value()
                if isinstance(number, Decimal)
                else float(number).is_integer()
            )
            if not integral:
                raise Refused(f"delta {value!r} is not an integer (the state is {value_type})")
            number = int(number)
        if not bounds[0] <= number <= bounds[1]:
            raise Refused(f"delta {number} is out of {value_type}'s range")
        return number
    if value_type == "double precision":
        return float(number)
    return number if isinstance(number, Decimal) else Decimal(repr(number))


def _number(what: str, value: Any) -> int | float | Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise Refused(f"{what} is a {type(value).__name__}, not a number")
    finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
    if not finite:
        raise Refused(f"{what} is {value!r}")
    return value


def _parsed(column: str, value: str, parse: Any) -> Any:
    try:
        return parse(value)
    except ValueError as err:
        raise Refused(f"key {column} {value!r}: {err}") from None


# -- a batch -----------------------------------------------------------------------------------


def check_rows(
    keys: Mapping[str, str], value_type: str, combiner: str, rows: Iterable[Sequence[Any]]
) -> list[tuple[Any, ...]]:
    """Rows ``(keys…, delta)`` as they are written, every one checked against the domain."""
    width = len(keys) + 1
    columns = list(keys.items())
    text_columns = [i for i, (_, t) in enumerate(columns) if t == "text"]
    checked = []
    for row in rows:
        if len(row) != width:
            raise ValueError(
                f"rows have {width} values (keys {list(keys)} then delta), got {len(row)}: {row!r}"
            )
        try:
            values = [key_value(c, t, v) for (c, t), v in zip(columns, row, strict=False)]
            if sum(len(values[i].encode()) for i in text_columns) > KEY_BYTES_LIMIT:
                raise Refused(f"the key's text is over {KEY_BYTES_LIMIT} UTF-8 bytes")
            values.append(delta_value(value_type, row[-1]))
        except Refused as refused:
            raise Refused(refused.problem, row) from None
        checked.append(tuple(values))
    check_batch_sums(value_type, combiner, checked)
    return checked


def check_batch_sums(value_type: str, combiner: str, rows: Sequence[Sequence[Any]]) -> None:
    """Refuse a batch whose deltas of one key sum out of the integer type's range."""
    bounds = integer_range(value_type)
    if bounds is None or combiner != "sum" or not rows:
        return
    if sum(abs(r[-1]) for r in rows) <= bounds[1]:
        return  # no key can leave the range: the common case, one pass
    sums: Counter[tuple[Any, ...]] = Counter()
    for row in rows:
        sums[tuple(row[:-1])] += row[-1]
    for key, total in sums.items():
        if not bounds[0] <= total <= bounds[1]:
            raise Refused(f"the batch's deltas sum to {total}, out of {value_type}'s range", key)


def arrow_rows(
    keys: Mapping[str, str], value_type: str, combiner: str, table: pa.Table
) -> pa.Table | list[tuple[Any, ...]]:
    """An Arrow table's rows, checked against the domain: by Arrow's kernels where they can
    (nulls, NUL, key sizes), by :func:`check_rows` for what needs converting (a float delta
    into an integer state, a date given as text). Returns the table itself when every column
    is written as it is (see :func:`encode_binary_copy`), else the converted rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [*keys, "delta"]
    for column in columns:
        values = table.column(column)
        if values.null_count:
            first = pc.index(pc.is_null(values), True).as_py()
            what = f"key {column}" if column in keys else "delta"
            raise Refused(f"{values.null_count} row(s) have a null {what}", _row(table, first))
    lengths = None
    for column, sql_type in keys.items():
        values = table.column(column)
        if sql_type != "text" or not (
            pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
        ):
            continue
        nul = pc.match_substring(values, "\x00")
        if pc.any(nul).as_py():
            raise Refused(
                f"key {column} holds NUL (\\x00), which Postgres text cannot store",
                _row(table, pc.index(nul, True).as_py()),
            )
        size = pc.binary_length(values)
        lengths = size if lengths is None else pc.add(lengths, size)
    if lengths is not None and (pc.max(lengths).as_py() or 0) > KEY_BYTES_LIMIT:
        first = pc.index(pc.greater(lengths, KEY_BYTES_LIMIT), True).as_py()
        raise Refused(f"the key's text is over {KEY_BYTES_LIMIT} UTF-8 bytes", _row(table, first))
    if _written_as_is(keys, value_type, table):
        _check_arrow_sums(keys, value_type, combiner, table)
        return table
    lists = [table.column(c).to_pylist() for c in columns]
    return check_rows(keys, value_type, combiner, zip(*lists, strict=True))


def _check_arrow_sums(
    keys: Mapping[str, str], value_type: str, combiner: str, table: pa.Table
) -> None:
    """:func:`check_batch_sums` by Arrow's kernels: one vectorised pass in the common case."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bounds = integer_range(value_type)
    if bounds is None or combiner != "sum" or table.num_rows == 0:
        return
    deltas = pc.cast(table.column("delta"), pa.float64(), safe=False)
    magnitude = pc.sum(pc.abs(deltas)).as_py() or 0.0
    if magnitude < bounds[1] / 2:  # a float sum, with room for its rounding: no key can overflow
        return
    rows = zip(*[table.column(c).to_pylist() for c in [*keys, "delta"]], strict=True)
    check_batch_sums(value_type, combiner, list(rows))


def _written_as_is(keys: Mapping[str, str], value_type: str, table: pa.Table) -> bool:
    """Whether every column's Arrow type is its SQL type's as is (no value needs converting or
    a per-row check: a string text key, an int64 bigint delta, …)."""
    import pyarrow as pa

    exact = {
        "text": (pa.string(), pa.large_string()),
        "bigint": (pa.int64(), pa.int32(), pa.int16(), pa.int8()),
        "double precision": (pa.float64(),),
    }
    wanted = {**keys, "delta": value_type}
    for column, sql_type in wanted.items():
        if table.column(column).type not in exact.get(sql_type, ()):
            return False
    if value_type == "double precision":  # NaN and infinities: checked here, by Arrow
        import pyarrow.compute as pc

        finite = pc.is_finite(table.column("delta"))
        if not pc.all(finite).as_py():
            first = pc.index(finite, False).as_py()
            raise Refused("delta is not finite (NaN or infinite)", _row(table, first))
    return True


def _row(table: pa.Table, index: int | None) -> tuple[Any, ...] | None:
    if index is None or index < 0:
        return None
    return tuple(table.slice(index, 1).to_pylist()[0].values())


# -- COPY --------------------------------------------------------------------------------------


def copy_rows(
    conn: Connection,
    stage_table: str,
    keys: Mapping[str, str],
    value_type: str,
    txid: int,
    attempt: int,
    rows: pa.Table | list[tuple[Any, ...]],
    *,
    job: str,
    quote: Any,
) -> int:
    """Replace ``job``'s staged rows of ``(txid, attempt)`` with ``rows`` (checked: an Arrow
    table whose columns are written as they are, or rows of converted values), by one binary
    COPY on the log's own connection (its transaction); returns how many were staged."""
    conn.execute(
        text(
            f"DELETE FROM {quote(stage_table)} "
            f"WHERE txid = :t AND attempt = :a AND {STAGE_JOB_COLUMN} = :j"
        ),
        {"t": txid, "a": attempt, "j": job},
    )
    # txid, attempt and job come from these settings (the staging table's defaults).
    conn.execute(
        text(
            "SELECT set_config('txn.stage_txid', :t, true), "
            "set_config('txn.stage_attempt', :a, true), set_config('txn.stage_job', :j, true)"
        ),
        {"t": str(txid), "a": str(attempt), "j": job},
    )
    columns = ", ".join([*(quote(c) for c in keys), "delta"])
    driver = conn.connection.driver_connection
    with driver.cursor() as cursor:  # type: ignore[union-attr]
        with cursor.copy(
            f"COPY {quote(stage_table)} ({columns}) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            if not isinstance(rows, list):  # an Arrow table written as it is
                for payload in encode_binary_copy(rows):
                    copy.write(payload)
                return int(rows.num_rows)
            copy.set_types([COPY_TYPES[t] for t in [*keys.values(), value_type]])
            count = 0
            for row in rows:
                copy.write_row(row)
                count += 1
    return count


# -- the binary COPY format, for Arrow columns -------------------------------------------------

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8  # signature, flags, header extension
_TRAILER = b"\xff\xff"
CHUNK_ROWS = 250_000


def encode_binary_copy(table: pa.Table, chunk_rows: int = CHUNK_ROWS) -> Iterator[bytes]:
    """``table`` (string, integer and float64 columns, no nulls: what :func:`arrow_rows` lets
    through as is) in Postgres's binary ``COPY`` format, a chunk of rows at a time, written by
    numpy from Arrow's buffers: no Python object per value.

    The format (Postgres docs, "COPY", "Binary Format"): a header, then per row a 16-bit field
    count and per field a 32-bit length and its bytes (text: UTF-8; int8: 64-bit big-endian;
    float8: IEEE 754 big-endian), then a trailer. psycopg's ``write_row`` writes the same bytes
    one value at a time (``tests/unit/state/test_staging.py`` compares them)."""
    yield _SIGNATURE
    for start in range(0, table.num_rows, chunk_rows):
        yield _encode_rows(table.slice(start, chunk_rows))
    yield _TRAILER


def _encode_rows(table: pa.Table) -> bytes:
    import numpy as np
    import pyarrow as pa

    n = table.num_rows
    fields: list[tuple[Any, Any, Any]] = []
    # per field: (lengths per row, text offsets or None, the bytes: text data or fixed values)
    for column in table.columns:
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            width = np.int64 if pa.types.is_large_string(array.type) else np.int32
            offsets = np.frombuffer(array.buffers()[1], dtype=width)
            offsets = offsets[array.offset : array.offset + n + 1].astype(np.int64)
            data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
            fields.append((np.diff(offsets), offsets, data))
        elif pa.types.is_floating(array.type):
            values = array.cast(pa.float64()).to_numpy(zero_copy_only=False)
            fields.append((np.full(n, 8, np.int64), None, values.astype(">f8").view(np.uint8)))
        else:
            values = array.cast(pa.int64()).to_numpy(zero_copy_only=False)
            fields.append((np.full(n, 8, np.int64), None, values.astype(">i8").view(np.uint8)))
    sizes = np.full(n, 2, dtype=np.int64)
    for lengths, _, _ in fields:
        sizes += 4 + lengths
    row_start = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=row_start[1:])
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    count = np.array([len(fields)], dtype=">i2").view(np.uint8)
    out[row_start] = count[0]
    out[row_start + 1] = count[1]
    at = row_start + 2
    for lengths, offsets, data in fields:
        length_bytes = lengths.astype(">i4").view(np.uint8).reshape(-1, 4)
        out[at[:, None] + np.arange(4)] = length_bytes
        at = at + 4
        if offsets is None:
            out[at[:, None] + np.arange(8)] = data.reshape(-1, 8)
        else:
            total = int(offsets[-1] - offsets[0])
            if total:
                row_of_byte = np.repeat(np.arange(n), lengths)
                within = np.arange(total) - (offsets[row_of_byte] - offsets[0])
                out[at[row_of_byte] + within] = data[offsets[0] : offsets[-1]]
        at = at + lengths
    return out.tobytes()


def stage_states(
    conn: Connection,
    txid: int,
    attempt: int,
    batches: Mapping[MapState, Iterable[Sequence[Any]]],
    *,
    job: str = "",
) -> dict[str, int]:
    """Stage several states' rows; return the output reference to record (row count per state).

    :param job: names the job staging, when several jobs of a txid stage (see
        :meth:`MapState.stage`).
    """
    return {
        state.output_key: state.stage(conn, txid, attempt, rows, job=job)
        for state, rows in batches.items()
    }
