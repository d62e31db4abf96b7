"""spark-submit never carries a secret on its command line (issue 11, item 6).

With a YARN or Kubernetes master, the provider's SparkSubmitHook turns ``env_vars`` into
``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` settings: the whole worker
environment (database URLs, the JWT secret, the Fernet key) ended up visible in ``ps``, the Spark
UI and YARN. The command is built here exactly as ``submit`` builds it, against connections given
as environment variables, with secrets planted in the environment.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from airflow_txn_provider.operators.spark_runner import SparkSubmitRunner
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.spark.job import LOG_URL_ENV, BatchJob

JOB = Path(__file__).resolve().parents[3] / "spark_jobs" / "word_count.py"
LOG_URL = "postgresql+psycopg2://txn:LOG-PASSWORD-1@db.internal:5432/txn"
SECRETS = {
    "AIRFLOW__CORE__FERNET_KEY": "FERNET-SECRET-2",
    "AIRFLOW__API_AUTH__JWT_SECRET": "JWT-SECRET-3",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:META-PASSWORD-4@db/airflow",
}
MASTERS = {
    "yarn": {"conn_type": "spark", "host": "yarn"},
    "k8s": {"conn_type": "spark", "host": "k8s://https://10.0.0.1:6443"},
    "standalone": {"conn_type": "spark", "host": "spark://10.0.0.2", "port": 7077},
    "local": {"conn_type": "spark", "host": "local[2]"},
}


@pytest.fixture
def secret_env(monkeypatch):
    from airflow.providers.apache.spark.hooks import spark_submit

    # The cncf.kubernetes provider is not installed here; the hook only checks it is importable.
    monkeypatch.setattr(spark_submit, "kube_client", types.SimpleNamespace(), raising=False)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    for name, conn in MASTERS.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_{name.upper()}", json.dumps(conn))
        cluster = {**conn, "extra": {"deploy-mode": "cluster"}}
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_{name.upper()}_CLUSTER", json.dumps(cluster))


def _job():
    return BatchJob("p", 3, 1, GeneratedTextSource())


def _secrets_in(text: str) -> list[str]:
    planted = [*SECRETS.values(), "LOG-PASSWORD-1", LOG_URL]
    return [s for s in planted if s in text]


@pytest.mark.parametrize("master", sorted(MASTERS))
def test_the_spark_submit_command_line_carries_no_secret(secret_env, master, fake_popen):
    runner = SparkSubmitRunner(JOB, log_url=LOG_URL, conn_id=f"spark_{master}")
    hook = runner.make_hook(_job())
    command = hook._build_spark_submit_command(str(JOB))
    text = " ".join(command)
    assert _secrets_in(text) == [], text
    assert "appMasterEnv" not in text and "driverEnv" not in text

    # ...and the job still gets the log's URL: in spark-submit's environment, which only its
    # user can read (the driver runs in that process: client deploy mode).
    started = fake_popen
    if master == "k8s":  # the hook then wants the driver pod's exit code, which a fake has not
        with pytest.raises(Exception, match="Kubernetes spark exit code"):
            hook.submit(str(JOB))
    else:
        hook.submit(str(JOB))
    assert _secrets_in(" ".join(started["cmd"])) == []
    assert started["env"][LOG_URL_ENV] == LOG_URL


@pytest.mark.parametrize("master", ["yarn", "k8s"])
def test_cluster_deploy_mode_without_a_way_to_the_log_is_refused(secret_env, master):
    """In cluster mode the driver runs in the cluster: its environment is not spark-submit's,
    and the only way the hook knows (--conf) puts the secret on a command line."""
    runner = SparkSubmitRunner(JOB, log_url=LOG_URL, conn_id=f"spark_{master}_cluster")
    with pytest.raises(ValueError, match="cluster deploy mode") as err:
        runner.make_hook(_job())
    assert _secrets_in(str(err.value)) == []


def test_a_kubernetes_secret_reference_gives_the_cluster_driver_the_log(secret_env):
    ref = {f"spark.kubernetes.driver.secretKeyRef.{LOG_URL_ENV}": "txn-log:url"}
    runner = SparkSubmitRunner(JOB, log_url=LOG_URL, conn_id="spark_k8s_cluster", conf=ref)
    text = " ".join(runner.make_hook(_job())._build_spark_submit_command(str(JOB)))
    assert f"spark.kubernetes.driver.secretKeyRef.{LOG_URL_ENV}=txn-log:url" in text
    assert _secrets_in(text) == []
