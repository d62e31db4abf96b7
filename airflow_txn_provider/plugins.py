"""The provider's Airflow plugin: registers the txid timetable (DAGs using it must be able to
deserialise it in the scheduler and the api-server). Loaded through the ``airflow.plugins``
entry point."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_txn_provider.timetables import TxidTimetable


class TxnProviderPlugin(AirflowPlugin):
    name = "airflow_txn_provider"
    timetables = [TxidTimetable]
