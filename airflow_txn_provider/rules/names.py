"""The one validator of names that reach SQL, a file path or a lake table's predicate.

Each name is checked against its rule when the object carrying it is built (a pipeline, a state,
a lake sink), and quoted where used (:func:`quote_ident`). ASCII only: a Unicode look-alike (a
Cyrillic "a", U+0430) is refused, not normalised, so the name a user reads is the one stored.

* ``PIPELINE`` (the lake staging directory, the DAG id): ``.``/``..``/``/`` would leave the
  table's directory;
* ``SQL_NAME`` (states' Postgres tables and columns): a table name is at most 63 bytes;
* ``COLUMN`` (lake sink names, merge keys, txid columns, Iceberg names): pasted into a merge
  predicate and a warehouse path;
* ``CONN_ID`` (an ``AIRFLOW_CONN_<ID>`` environment variable): a ``=`` or NUL would break it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_txn_provider.rules.exceptions import InvalidNameError


@dataclass(frozen=True)
class NameRule:
    """A kind of name: what it matches (in full), said in words for the error."""

    kind: str
    pattern: re.Pattern[str]
    rule: str


PIPELINE = NameRule(
    "pipeline name",
    re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}"),
    "ASCII letters, digits, '_', '.' and '-', not starting with '.' or '-', at most 200 "
    "characters (it names the lake staging directory and the DAG id)",
)
SQL_NAME = NameRule(
    "SQL name",
    re.compile(r"[a-z_][a-z0-9_]{0,39}"),
    "a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 40 characters)",
)
COLUMN = NameRule(
    "column name",
    re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}"),
    "an ASCII identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 characters)",
)

CONN_ID = NameRule(
    "connection id",
    re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,249}"),
    "ASCII letters, digits, '_', '.' and '-', at most 250 characters (it names the "
    "AIRFLOW_CONN_<ID> environment variable)",
)


def check_name(
    value: object, rule: NameRule, *, what: str | None = None, pipeline: str | None = None
) -> str:
    """``value`` if it is a ``str`` that matches ``rule`` in full, else :class:`InvalidNameError`
    naming ``what`` (default: the rule's kind) and the rule."""
    if isinstance(value, str) and rule.pattern.fullmatch(value):
        return value
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise InvalidNameError(
        f"{what or rule.kind} {shown} is refused: it must be {rule.rule}", pipeline=pipeline
    )


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted identifier (Postgres, and DataFusion's predicates in Delta).
    Names are checked before they get here; quoting still doubles a ``"`` so a name can never
    end the identifier, and lets a key column be a reserved word (``user``, ``order``, ``end``)."""
    return '"' + name.replace('"', '""') + '"'


def state_tables(name: str) -> tuple[str, str, str]:
    """The tables of the state ``name``: state, staging, undo records."""
    return f"txn_state_{name}", f"txn_stage_{name}", f"txn_undo_{name}"


def as_of_function(name: str) -> str:
    """The SQL function that reads the state ``name`` as of a txid (``txn_as_of_<name>(txid)``)."""
    return f"txn_as_of_{name}"


__all__ = [
    "COLUMN",
    "CONN_ID",
    "PIPELINE",
    "SQL_NAME",
    "NameRule",
    "as_of_function",
    "check_name",
    "quote_ident",
    "state_tables",
]
