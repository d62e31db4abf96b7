"""Airflow hook: ``spark-submit`` of a transaction job, on the Spark provider's ``SparkSubmitHook``.

Used by :class:`~airflow_txn_provider.operators.spark_runner.SparkSubmitRunner`; the connection is
the Spark provider's own ``spark`` type (this provider registers no connection type for it).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Connection

from airflow_txn_provider.compat.airflow import AirflowNotFoundException
from airflow_txn_provider.spark.job import LOG_URL_ENV

log = logging.getLogger(__name__)

K8S_SECRET_REF = "spark.kubernetes.driver.secretKeyRef."
DEFAULT_SPARK_CONN = "spark_default"
DEFAULT_MASTER = "local[*]"
"""The master of a missing ``spark`` connection: a laptop or a CI runner works unconfigured."""


class TxnSparkSubmitHook(SparkSubmitHook):
    """The provider's ``SparkSubmitHook`` with three changes for transaction jobs, made through
    its public interface (constructor arguments, :meth:`get_connection`, :meth:`submit`'s
    ``Popen`` arguments, :meth:`on_kill`).

    * A missing connection means ``local[*]``, not the provider's ``yarn`` fallback: a laptop or
      a CI runner works without configuration; set the connection to go to a cluster.
      (:meth:`get_connection` answers a missing id with a ``spark`` connection to ``local[*]``,
      which the provider resolves like any other.)
    * ``env_vars`` only ever become ``spark-submit``'s process environment, readable by its user
      alone (they are :meth:`submit`'s ``env``, never the provider's ``env_vars``). The provider
      turns its ``env_vars`` into ``--conf spark.yarn.appMasterEnv.*`` /
      ``spark.kubernetes.driverEnv.*`` settings for a YARN or Kubernetes master: secrets in them
      would be on a command line (``ps``), in the Spark UI and in YARN. The driver runs in that
      process (client deploy mode); cluster deploy mode on YARN or Kubernetes is refused unless
      ``conf`` gives the driver the log another way (a Kubernetes secret reference).
    * ``spark-submit`` runs in its own process group (``start_new_session``) and :meth:`on_kill`
      signals the whole group: killing only the ``spark-submit`` JVM (the provider's default) can
      leave its Python driver and workers running.

    Two of the provider's attributes are read, since it offers no public accessor for them:
    ``_connection`` (the master and deploy mode it resolved: :attr:`master`,
    :attr:`deploy_mode`) and ``_submit_sp`` (the ``spark-submit`` process, whose group
    :meth:`on_kill` stops). No private method is overridden or called; ``pyproject.toml`` bounds
    the provider below 7 for these two reads.

    :param conn_id: the ``spark`` connection (default ``spark_default``).
    :param conf: Spark settings (``--conf``).
    :param env_vars: the environment of ``spark-submit`` (and so of a client-mode driver).
    :param kwargs: any other ``SparkSubmitHook`` argument.
    """

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_SPARK_CONN,
        conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        # No env_vars for the provider: it would put them on the command line (YARN, Kubernetes)
        super().__init__(conn_id=conn_id, conf=dict(conf or {}), **kwargs)
        self.conn_id = conn_id
        self.spark_conf = dict(conf or {})
        self.process_env = dict(env_vars or {})
        if self.is_remote and self.deploy_mode == "cluster":
            given = [k for k in self.spark_conf if k.endswith(f".{LOG_URL_ENV}")]
            if not any(k.startswith(K8S_SECRET_REF) for k in given):
                raise ValueError(
                    f"spark connection {conn_id!r}: cluster deploy mode on {self.master} "
                    f"runs the driver in the cluster, which then needs ${LOG_URL_ENV} without "
                    "it going on a command line: use client deploy mode, or (Kubernetes) set "
                    f"{K8S_SECRET_REF}{LOG_URL_ENV}=<secret>:<key> in the pipeline's spark_conf"
                )

    @classmethod
    def get_connection(cls, conn_id: str) -> Connection:
        """The connection ``conn_id``; a missing one is a ``spark`` connection to ``local[*]``."""
        try:
            return cast(Connection, super().get_connection(conn_id))
        except AirflowNotFoundException:
            log.info("No connection %r: using master %s", conn_id, DEFAULT_MASTER)
            return Connection(conn_id=conn_id, conn_type="spark", host=DEFAULT_MASTER)

    @property
    def master(self) -> str:
        """The master ``spark-submit`` is given (``--master``), as the provider resolved it."""
        return str(self._connection["master"])

    @property
    def deploy_mode(self) -> str | None:
        """The deploy mode (``client``, ``cluster`` or none), as the provider resolved it."""
        mode = self._connection["deploy_mode"]
        return None if mode is None else str(mode)

    @property
    def is_remote(self) -> bool:
        """Whether the master is YARN or Kubernetes (where the provider would ship env_vars)."""
        return "yarn" in self.master or "k8s" in self.master

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        kwargs.setdefault("start_new_session", True)
        if self.process_env:
            kwargs.setdefault("env", self.process_env)
        return cast("str | None", super().submit(application, **kwargs))

    def on_kill(self) -> None:
        process = getattr(self, "_submit_sp", None)
        if process is not None and process.poll() is None:
            self.log.info("Stopping spark-submit process group %s", process.pid)
            stop_process_group(process)
        super().on_kill()


def stop_process_group(popen: subprocess.Popen[Any], *, timeout: float = 20.0) -> None:
    """SIGTERM the process group ``popen`` leads, then SIGKILL what is left after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(popen.pid):
            popen.poll()
            time.sleep(0.1)
        if not group_alive(popen.pid):
            break
    popen.poll()


def group_alive(pgid: int) -> bool:
    """Whether a process of process group ``pgid`` still runs (zombies do not count)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
