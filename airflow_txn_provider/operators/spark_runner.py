"""Running a processing job: ``spark-submit`` through the Spark provider, or the Spark Connect path.

:class:`SparkSubmitRunner` submits a job file in ``spark_jobs/`` with
:class:`~airflow_txn_provider.hooks.spark_submit.TxnSparkSubmitHook` and a ``spark`` connection
(``local[*]`` without one): one JVM per txid, isolated, the path to a cluster.
:class:`SparkConnectRunner` runs the job's ``transform`` in this process against the
``spark_connect`` connection's server: no JVM start per txid. Killed (:meth:`kill`, from an
operator's ``on_kill``), the first signals ``spark-submit``'s process group; the second interrupts
only its own operations (:func:`operation_tag`), and only while the session is still its own: a
slot's session serves the pipeline's next txids
(:mod:`~airflow_txn_provider.spark.connect_sessions`). A killed run reports no failure
(:attr:`SparkConnectRunner.stopped`): whoever stopped it decides.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from airflow_txn_provider.compat.spark import PYSPARK_VERSION, SUPPORTS_CONNECT
from airflow_txn_provider.rules.exceptions import TxnConfigError
from airflow_txn_provider.spark.connect_sessions import (
    bound_client_retries,
    is_session_closed,
    keep_classic_mode,
    leased_slot,
    with_session_id,
)
from airflow_txn_provider.spark.job import (
    CONNECT_MODE_ENV,
    LOG_URL_ENV,
    BatchJob,
    ProcessOutcome,
    Transform,
    process_batch,
)
from airflow_txn_provider.utils.retries import Backoff

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_txn_provider.hooks.spark_submit import TxnSparkSubmitHook
    from airflow_txn_provider.spark.connect_sessions import SessionSlot
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

DEFAULT_SPARK_CONNECT_CONN = "spark_connect_default"


def spark_env(**extra: str) -> dict[str, str]:
    """Environment for ``spark-submit``: this interpreter's venv first on PATH, and as PySpark's
    Python (spark-submit finds SPARK_HOME by running ``python3`` from PATH)."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SPARK_HOME", None)  # a stray SPARK_HOME of another version would win over the venv's
    for name in CONNECT_MODE_ENV:  # for processes started with this env (Spark servers)
        env.pop(name, None)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.update(extra)
    return env


class SparkSubmitRunner:
    """Run a job file of ``spark_jobs/`` for one txid with ``spark-submit``.

    :param application: path of the job file (its ``main`` calls ``run_job``).
    :param log_url: the transaction log's URL, handed to the job in ``$TXN_LOG_URL``.
    :param conn_id: the ``spark`` connection (master, deploy mode, spark-binary); default the
        hook's, ``spark_default``.
    :param conf: extra Spark settings (``--conf``).
    :param env: extra environment of the job.
    :param hook_kwargs: any other ``SparkSubmitHook`` argument (executor_memory, py_files, …).
    """

    def __init__(
        self,
        application: str | os.PathLike[str],
        *,
        log_url: str,
        conn_id: str | None = None,
        conf: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        **hook_kwargs: Any,
    ) -> None:
        self.application = os.fspath(application)
        if not Path(self.application).is_file():
            raise FileNotFoundError(f"Spark job file {self.application} does not exist")
        self.log_url = log_url
        self.conn_id = conn_id
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.hook_kwargs = hook_kwargs
        self.hook: TxnSparkSubmitHook | None = None

    def make_hook(self, job: BatchJob) -> TxnSparkSubmitHook:
        # at call time: this module imports without Airflow (test_spark_submit.py), and the hook
        # is the Spark provider's
        from airflow_txn_provider.hooks.spark_submit import TxnSparkSubmitHook

        conf = {"spark.pyspark.python": sys.executable, **self.conf}
        return TxnSparkSubmitHook(
            **({"conn_id": self.conn_id} if self.conn_id else {}),
            application_args=job.to_args(),
            name=job.app_name,
            conf=conf,
            env_vars=spark_env(**{LOG_URL_ENV: self.log_url}, **self.env),
            **self.hook_kwargs,
        )

    def run(self, job: BatchJob) -> None:
        """Submit and wait; raises ``AirflowException`` if the job exits non-zero."""
        self.hook = self.make_hook(job)
        log.info("%s: spark-submit %s to %s", job.app_name, self.application, self.master)
        self.hook.submit(self.application)

    @property
    def master(self) -> str:
        return self.hook.master if self.hook else "?"

    def kill(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()


def load_job_module(path: str | os.PathLike[str]) -> ModuleType:
    """Import a job file of ``spark_jobs/`` by path (it need not be on ``sys.path``)."""
    path = Path(path).resolve()
    name = f"txn_job_{path.stem}_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import job file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    # The module is not importable where Spark runs Python (a Connect server's workers): ship
    # its functions (UDFs) by value, not as references to a module the workers cannot import.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    if not callable(getattr(module, "transform", None)):
        raise ImportError(f"job file {path} defines no transform(batch) function")
    return module


class SparkConnectRunner:
    """Run a job's ``transform`` for one txid in this process, on a Spark Connect server.

    :param transform: the transform, or a job file path whose ``transform`` to use.
    :param conn_id: the provider's ``spark_connect`` connection (``sc://host:15002``).
    :param url: a Spark Connect URL, instead of ``conn_id``.
    :param connect_timeout: seconds to wait for an unreachable (restarting) server.
    :param reuse_sessions: attach to a server session of one of the pipeline's slots, kept from
        txid to txid (:mod:`~airflow_txn_provider.spark.connect_sessions`); ``False``: a new
        server session per txid.
    """

    def __init__(
        self,
        transform: Transform | str | os.PathLike[str],
        *,
        conn_id: str = DEFAULT_SPARK_CONNECT_CONN,
        url: str | None = None,
        connect_timeout: float = 180.0,
        reuse_sessions: bool = True,
    ) -> None:
        if not SUPPORTS_CONNECT:
            raise TxnConfigError(
                f"Spark Connect (connection {conn_id!r}) needs PySpark 4.0 or later, this is "
                f"{PYSPARK_VERSION}: run the jobs with spark-submit on Spark 3.5 "
                "(docs/deployment.md, Supported versions)"
            )
        if isinstance(transform, (str, os.PathLike)):
            transform = cast(Transform, load_job_module(transform).transform)
        self.transform: Transform = transform
        self.conn_id = conn_id
        self.url = url
        self.connect_timeout = connect_timeout
        self.reuse_sessions = reuse_sessions
        self.session: SparkSession | None = None
        self.stopped = False
        """Set by :meth:`kill` (for good): its work is to end, and it reports no failure."""
        self._run: tuple[BatchJob, str] | None = None  # the running job and its operation tag
        # Reentrant: kill() may run in a signal handler on the thread that holds it (Airflow's
        # SIGTERM); another thread (the lease's) waits until the session is no longer this run's.
        self._guard = threading.RLock()

    def connection_url(self) -> str:
        if self.url:
            return self.url
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return str(SparkConnectHook(self.conn_id).get_connection_url())

    def run(
        self, job: BatchJob, txlog: TransactionLog, *, holder: str | None = None
    ) -> ProcessOutcome:
        """Process ``job`` on a session of the pipeline (:meth:`_session`). ``holder``: the
        attempt's lease holder name of this process; a failure it reports is refused once
        another process (a later try of the task) holds the attempt's lease."""
        with keep_classic_mode(), self._session(job, txlog) as (session, connect):
            tag = operation_tag(job)
            session.addTag(tag)  # every operation of this run (thread-local: this thread's)
            with self._guard:
                self.session, self._run = session, (job, tag)
            try:
                return process_batch(
                    session,
                    txlog,
                    job,
                    self.transform,
                    timings=connect,
                    holder=holder,
                    stopped=lambda: self.stopped,
                )
            finally:
                # Before the session is stopped and its slot released: a kill() from now on
                # finds nothing of this run to interrupt.
                with self._guard:
                    self.session, self._run = None, None

    @contextlib.contextmanager
    def _session(
        self, job: BatchJob, txlog: TransactionLog
    ) -> Iterator[tuple[SparkSession, dict[str, float]]]:
        """The txid's session: the server session of a slot of the pipeline that this process
        leased (:mod:`~airflow_txn_provider.spark.connect_sessions`), or one of its own. A
        failure releases it on the server, so nothing the failed attempt left there reaches
        another txid; a success leaves a slot's session to the slot's next txid."""
        from pyspark.sql import SparkSession

        url = self.connection_url()
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            slot = None
            if self.reuse_sessions and "session_id=" not in url:
                slot = stack.enter_context(leased_slot(txlog.engine, job.pipeline, url))
            session: Any  # a Spark Connect session
            session, shared = self._connect(SparkSession, url, slot)
            log.info(
                "pipeline=%s txid=%s attempt=%s: Spark Connect session %s (%s)",
                job.pipeline,
                job.txid,
                job.attempt,
                session.session_id,
                f"slot {slot.slot}" if shared and slot else "its own",
            )
            failed = True
            try:
                yield session, {"connect": time.monotonic() - started}
                failed = False
            finally:
                session.release_session_on_close = failed or not shared
                session.stop()

    def _connect(
        self, session_class: Any, url: str, slot: SessionSlot | None
    ) -> tuple[SparkSession, bool]:
        """A session, and whether it is the slot's, waiting (with backoff, 0.5 s doubling to
        4 s, up to ``connect_timeout`` seconds: a
        :class:`~airflow_txn_provider.utils.retries.Backoff`) for a Spark Connect server that is
        restarting: a replay then runs once it is back,
        instead of failing again at once and counting toward the poison-batch limit."""
        from tenacity import retry_if_exception

        backoff = Backoff(first=0.5, cap=4.0, deadline=self.connect_timeout)
        for attempt in backoff.retrying(
            # A bad URL (PySpark's ValueError) will not heal by waiting: it fails at once.
            retry=retry_if_exception(lambda err: not isinstance(err, (ValueError, TypeError))),
            before_sleep=lambda state: log.warning(
                "Spark Connect server %s unreachable (%s); retrying",
                url.split(";")[0],
                str(state.outcome.exception() if state.outcome else "")[:200],
            ),
            reraise=True,
        ):
            with attempt:
                return _open_session(session_class, url, slot)
        raise AssertionError("unreachable")  # Retrying returns or re-raises

    def kill(self) -> None:
        """Stop this run: interrupt its own operations (by its tag, never every operation of a
        session that later txids reuse) while the session is still this run's, and mark it
        :attr:`stopped`, so that the error the interruption causes is not reported as a failure
        of the attempt. Whoever stopped the run decides about the attempt: Airflow stopped a
        try that a later try resumes (its stale-success race, apache/airflow#72716), or failed
        the task (its failure callback, else the lease runs out); a lost lease means the attempt
        failed already."""
        self.stopped = True
        with self._guard:
            session, run = self.session, self._run
            if session is None or run is None:
                log.info("Spark Connect run ended or not started: nothing of it to interrupt")
                return
            job, tag = run
            try:
                interrupted = session.interruptTag(tag)
            except Exception as err:  # best effort: a stopped run reports nothing either way
                log.warning(
                    "pipeline=%s txid=%s attempt=%s: interrupting its Spark work failed: %s",
                    job.pipeline,
                    job.txid,
                    job.attempt,
                    err,
                )
                return
        log.info(
            "pipeline=%s txid=%s attempt=%s: interrupted its Spark Connect operations %s",
            job.pipeline,
            job.txid,
            job.attempt,
            interrupted,
        )


def operation_tag(job: BatchJob) -> str:
    """The tag of every Spark Connect operation of one run of ``job``: its pipeline, txid and
    attempt, and a nonce (two processes may run one attempt: an Airflow try and the later try
    that resumed it)."""
    # Spark refuses a tag with a comma; a pipeline name has none (names.py)
    return f"txn-{job.pipeline}-txid-{job.txid}-attempt-{job.attempt}-{uuid.uuid4().hex[:12]}"


def _open_session(session_class: Any, url: str, slot: SessionSlot | None) -> tuple[Any, bool]:
    """The slot's session at its first generation the server has not closed, else (no slot, or
    every generation closed) a session of its own; and whether it is the slot's."""
    candidates = [with_session_id(url, s) for s in slot.session_ids()] if slot else []
    for candidate in [*candidates, url]:
        session = session_class.builder.remote(candidate).create()
        try:
            bound_client_retries(session)
            # The first call reaches the server: an analysis, not a query (a collect is an
            # execution on the server and more round trips).
            _ = session.version
        except BaseException as err:
            session.release_session_on_close = False
            with contextlib.suppress(Exception):
                session.stop()
            if candidate != url and is_session_closed(err):
                continue  # released after a failure, or expired: the slot's next generation
            raise
        return session, candidate != url
    raise AssertionError("unreachable")  # the last candidate returns or raises
