"""The provider's Airflow plugin, registered once: by the ``airflow.plugins`` entry point, which
Airflow always loads. (A provider's ``plugins`` info is loaded only with
``[core] lazy_discover_providers = False``, and then in addition: Airflow reported the second
registration as a plugin import error, "already registered, skipping".)

* The txid timetable: DAGs using it must be able to deserialise it in the scheduler and the
  api-server.
* The "Transactions" page (:mod:`airflow_txn_provider.ui`): a FastAPI app mounted at
  ``/transactions``, a nav entry to its list of pipelines, and a tab on every DAG run page showing
  that txid's attempts. Airflow replaces ``{DAG_ID}`` and ``{RUN_ID}`` in the tab's address; a
  relative address is shown in an iframe on the same origin, so Airflow's session cookie
  authenticates it. The address is keyed by DAG id: the app finds the pipeline the transaction
  log records that DAG as running (a DAG built with ``build_dag(pipeline, dag_id=…)`` is not
  named like its pipeline).
* A listener (:mod:`airflow_txn_provider.ui.run_marks`): a note on a txid's run that a person
  marked success or failed, saying what the log says of the txid.

Every process that loads plugins imports this module (each task too): the app is a
:class:`~airflow_txn_provider.ui.LazyApp`, built at its first request in the api-server, so this
import stays cheap and connects to nothing.
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
