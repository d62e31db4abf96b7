# $AIRFLOW_HOME/config/airflow_local_settings.py of the image: the scheduler (LocalExecutor) and
# Celery workers import what a processing task needs once, and every task process they fork
# inherits it (airflow_txn_provider/preload.py says how much that saves).
from airflow_txn_provider import warm_task_processes

warm_task_processes()
__all__: list[str] = []  # nothing here is an Airflow setting or policy
