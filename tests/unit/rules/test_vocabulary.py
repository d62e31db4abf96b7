"""The vocabulary (rules/vocabulary.py): every enum a ``str`` enum, stored and shown as its value,
each value one member's, and the values the log stores fit its columns."""

from __future__ import annotations

import enum
import json

from airflow_txn_provider.log.models import Base, StrEnumText
from airflow_txn_provider.rules import vocabulary

ENUMS = sorted(
    (
        value
        for value in vars(vocabulary).values()
        if isinstance(value, type)
        and issubclass(value, enum.Enum)
        and value.__module__ == vocabulary.__name__
    ),
    key=lambda cls: cls.__name__,
)


def test_every_member_is_its_value_as_a_string():
    assert {"TxStatus", "SourceKind", "StateKind", "EventState", "BeginAction"} <= {
        cls.__name__ for cls in ENUMS
    }
    for enum_class in ENUMS:
        assert issubclass(enum_class, str), enum_class
        for member in enum_class:
            assert member == member.value and isinstance(member.value, str), member
            assert str(member) == f"{member}" == member.value, member  # shown as its value
            assert json.dumps(member) == json.dumps(member.value), member  # stored as its value
            assert enum_class(member.value) is member  # and read back


def test_no_two_names_share_a_value():
    """An alias would make one name silently mean another: every name is a member of its own."""
    for enum_class in ENUMS:
        assert len(enum_class.__members__) == len(list(enum_class)), enum_class


def test_the_values_the_log_stores_fit_its_columns():
    stored = [
        column
        for table in Base.metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, StrEnumText)
    ]
    assert {c.type.enum_class for c in stored} >= {
        vocabulary.TxStatus,
        vocabulary.SourceKind,
        vocabulary.StateKind,
        vocabulary.FailureResponse,
    }
    for column in stored:
        width = column.type.impl.length
        for member in column.type.enum_class:
            assert len(member.value) <= width, (column, member)
