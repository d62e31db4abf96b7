"""The log's change notifications, as a waiter reads them (log.changes.change_of)."""

from __future__ import annotations

from airflow_txn_provider.log.changes import change_of
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.rules.waiting import TxidChange


def test_a_notification_names_the_txid_and_the_status_it_reached() -> None:
    assert change_of("orders.v2 17 processed", "orders.v2") == TxidChange(17, TxStatus.PROCESSED)
    assert change_of("orders 3 committed", "orders") == TxidChange(3, TxStatus.COMMITTED)


def test_another_pipelines_notification_is_none_of_its_business() -> None:
    assert change_of("orders.v2 17 processed", "orders") is None
    assert change_of("orders 17 processed", "orders.v2") is None


def test_a_notification_of_an_earlier_release_wakes_every_wait() -> None:
    # the pipeline's name alone: a change of an unknown txid, read as a failure
    assert change_of("orders", "orders") == TxidChange(0, TxStatus.FAILED)
    assert change_of("orders 3 renamed", "orders") == TxidChange(0, TxStatus.FAILED)
