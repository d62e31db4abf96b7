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
                "python-modules": [
                    "airflow_txn_provider.hooks.txn_log",
                    "airflow_txn_provider.hooks.spark_submit",
                    "airflow_txn_provider.hooks.airflow_api",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Transactional Spark batches",
                "python-modules": [
                    "airflow_txn_provider.operators.txn",
                    "airflow_txn_provider.operators.commit",
                    "airflow_txn_provider.operators.fill",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Transactional Spark batches",
                "python-modules": ["airflow_txn_provider.sensors.txn_failure"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Transactional Spark batches",
                "python-modules": ["airflow_txn_provider.triggers.txn_log"],
            }
        ],
        # TxnSparkSubmitHook (hooks.spark_submit) has none of its own: it reads the Spark
        # provider's "spark" connections, and a type is registered by one provider only.
        "connection-types": [
            {
                "hook-class-name": "airflow_txn_provider.hooks.txn_log.TxnLogHook",
                "hook-name": "Transaction log (Postgres)",
                "connection-type": "txn_log",
                # Read without importing the hook (TxnLogHook.get_ui_field_behaviour, in the
                # provider info's kebab-case keys)
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database"},
                    "placeholders": {
                        "host": "127.0.0.1",
                        "port": "5432",
                        "schema": "postgres",
                        "extra": '{"sslmode": "prefer"}',
                    },
                },
            },
            {
                "hook-class-name": "airflow_txn_provider.hooks.airflow_api.AirflowApiHook",
                "connection-type": "airflow_api",
            },
        ],
        "config": {
            "txn_provider": {
                "description": "Transactional Spark batches.",
                "options": {
                    "failure_injection": {
                        "description": (
                            "Let the Airflow Variable txn_inject_failure__<pipeline> fail chosen "
                            "attempts of chosen txids (e.g. 3, 3:2, 3:*, 3@8), to see a cascade, "
                            "a replay and a poison batch. For demos and tests: off, processing "
                            "tasks read no Variable."
                        ),
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "preload_task_processes": {
                        "description": (
                            "Whether the processes that fork task processes (the scheduler with "
                            "the LocalExecutor, each Celery worker) import the Spark Connect "
                            "client and the provider's job code once at their start, so that "
                            "every task starts warm (1-2 s of imports less per processing task), "
                            "and the dag-processor what a pipeline's DAG file imports."
                        ),
                        "version_added": "0.2.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "trigger_pool_size": {
                        "description": (
                            "Connections to one transaction log that all the deferred waits "
                            "(begin, commit, failure watch) of one triggerer share: a poll holds "
                            "one for a few milliseconds, so a pipeline's connection count does "
                            "not grow with max_pending or with the number of pipelines."
                        ),
                        "version_added": "0.2.0",
                        "type": "integer",
                        "example": "4",
                        "default": "4",
                    },
                    "run_ahead_waits": {
                        "description": (
                            "How many run aheads (the claims of the txids just past a full "
                            "window, up to three per pipeline) may wait in a worker at once for "
                            "their turn to begin, all pipelines of one transaction log together; "
                            "a claim makes no more runs ahead than there are free slots, and a "
                            "run ahead that finds none defers to the triggerer. A waiting claim "
                            "begins the moment the window has room for it (the log notifies it), "
                            "but holds a worker slot meanwhile: with many backlogged pipelines, "
                            "unbounded waits would take the slots of the processing tasks they "
                            "wait for. 0: no run is made ahead of the window."
                        ),
                        "version_added": "0.2.0",
                        "type": "integer",
                        "example": "4",
                        "default": "4",
                    },
                    "commit_waits": {
                        "description": (
                            "How many processing tasks may wait in a worker at once (up to 30 "
                            "s each) for the txids before theirs to commit, all pipelines of one "
                            "transaction log together. A task whose txid commits meanwhile ends "
                            "its run; one that does not wait leaves the commit to its run's "
                            "commit task in the triggerer, which costs Airflow a trigger and a "
                            "DAG-file parse per txid. 0: no task waits."
                        ),
                        "version_added": "0.2.0",
                        "type": "integer",
                        "example": "4",
                        "default": "4",
                    },
                },
            }
        },
    }
