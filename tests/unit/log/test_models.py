"""The log's typed columns: the vocabulary's enums in, the vocabulary's enums out."""

import pytest
from sqlalchemy.dialects import postgresql

from airflow_txn_provider.log.models import (
    ATTEMPTS,
    PIPELINES,
    STATE_REGISTRY,
    TRANSACTIONS,
    StrEnumText,
    one_of,
)
from airflow_txn_provider.rules.exceptions import CorruptLogError
from airflow_txn_provider.rules.vocabulary import FailureResponse, SourceKind, StateKind, TxStatus

DIALECT = postgresql.dialect()


@pytest.mark.parametrize(
    ("column", "enum_class"),
    [
        (TRANSACTIONS.c.status, TxStatus),
        (ATTEMPTS.c.status, TxStatus),
        (ATTEMPTS.c.response, FailureResponse),
        (PIPELINES.c.source_kind, SourceKind),
        (STATE_REGISTRY.c.kind, StateKind),
    ],
)
def test_enum_columns_bind_values_and_read_members(column, enum_class):
    kind = column.type
    assert isinstance(kind, StrEnumText) and kind.enum_class is enum_class
    assert kind.compile(dialect=DIALECT) == "VARCHAR(20)"  # the migrations' column type
    for member in enum_class:
        assert kind.process_bind_param(member, DIALECT) == member.value
        assert kind.process_bind_param(member.value, DIALECT) == member.value
        read = kind.process_result_value(member.value, DIALECT)
        assert read is member
    assert kind.process_result_value(None, DIALECT) is None


def test_an_unknown_stored_value_is_a_corrupt_log():
    with pytest.raises(CorruptLogError, match="unknown status 'lost'"):
        TRANSACTIONS.c.status.type.process_result_value("lost", DIALECT)


def test_a_value_outside_the_enum_is_never_written():
    with pytest.raises(ValueError, match="'lost'"):
        TRANSACTIONS.c.status.type.process_bind_param("lost", DIALECT)


def test_check_constraints_allow_exactly_the_enum():
    assert one_of("status", TxStatus) == (
        "status IN ('processing', 'processed', 'committed', 'failed')"
    )
    checks = {c.name: str(c.sqltext) for c in TRANSACTIONS.constraints if hasattr(c, "sqltext")}
    assert checks["ck_txn_transaction_status"] == one_of("status", TxStatus)  # as migrated
