"""The provider's Airflow plugin, registered once, by the ``airflow.plugins`` entry point.

(Not also through the provider info's ``plugins``: Airflow loads those only with ``[core]
lazy_discover_providers = False``, and reports the second registration as an import error.)
It adds the txid timetable (the scheduler and the api-server deserialise DAGs that use it); the
"Transactions" page (:mod:`airflow_txn_provider.ui`) at ``/transactions``, with a nav entry and a
tab on every DAG run page, keyed by DAG id, in a same-origin iframe that Airflow's session cookie
authenticates; and a listener (:mod:`airflow_txn_provider.ui.run_marks`) that notes on a run a
person marked what the log says of its txid. Every process that loads plugins imports this
module, so it connects to nothing: the app is a :class:`~airflow_txn_provider.ui.LazyApp`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_txn_provider.timetables import TxidTimetable
from airflow_txn_provider.ui import MOUNT_PATH, plugin_app, run_marks


class TxnProviderPlugin(AirflowPlugin):
    name = "airflow_txn_provider"
    timetables = [TxidTimetable]
    # a note on a txid's run marked success or failed by hand (called in the api-server)
    listeners = [run_marks]
    fastapi_apps = [{"app": plugin_app, "url_prefix": MOUNT_PATH, "name": "Transactions"}]
    external_views = [
        {
            "name": "Transactions",
            "href": f"{MOUNT_PATH}/",
            "destination": "nav",
            "url_route": "transactions",
            "icon": f"{MOUNT_PATH}/static/icon.svg",
        },
        {
            "name": "Transactions",
            "href": f"{MOUNT_PATH}/dags/{{DAG_ID}}/runs/{{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "txid-attempts",
        },
    ]
