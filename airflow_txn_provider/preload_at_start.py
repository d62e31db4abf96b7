"""Loaded by Airflow at the start of each of its processes, as a policy plugin (the package's
``airflow.policy`` entry point): warms the task processes of the scheduler and of Celery workers
(:mod:`airflow_txn_provider.preload`). It defines no policy."""

from airflow_txn_provider.preload import warm_at_start

warm_at_start()
