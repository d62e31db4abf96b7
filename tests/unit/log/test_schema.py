"""The schema's head revision, as the hot path knows it without Alembic."""

from airflow_txn_provider.log import schema


def test_head_revision_constant_is_alembics_head():
    # ensure() compares the database's revision with HEAD_REVISION: a new migration that does not
    # move the constant would never be applied by a task process.
    assert schema.head_revision() == schema.HEAD_REVISION
