"""Provider metadata read by Airflow's ProvidersManager through the ``apache_airflow_provider``
entry point. ``package-name`` must equal the normalised distribution name."""

from __future__ import annotations

from typing import Any

from airflow_txn_provider import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-txn-provider",
        "name": "Transactional Spark batches",
        "description": (
            "Ordered Spark batch transactions (Storm's transactional topologies): txids processed "
            "in parallel, committed in order, exactly-once state in Postgres."
        ),
        "versions": [__version__],
        "hooks": [
            {
                "integration-name": "Transactional Spark batches",
                "python-modules": ["airflow_txn_provider.hooks.txn_log"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_txn_provider.hooks.txn_log.TxnLogHook",
                "connection-type": "txn_log",
            }
        ],
    }
