"""One Airflow deployment shared by the browser, credentials, Kafka and Airflow chaos tests.

Starting a deployment (``airflow db migrate``, scheduler, dag-processor, triggerer, api-server)
takes ~40 s on an idle machine of this kind and 80-105 s inside ``make test``: the tests share
one, with DAGs of their own, on one transaction log.

- ``example_txn_words``, the example as a user drops it in (``dags/``, with its helper), on the
  session's Spark Connect server: the browser test's.
- ``secret_words`` (``tests/dags/txn_words.py``): ``spark-submit`` jobs that commit into an
  Iceberg table whose catalog is the Airflow connection ``ice_cat``, and whose txid 2 holds a
  marked line the job refuses: the credentials test's. Its alerts go by mail to an SMTP server
  the tests own on 127.0.0.1 (``SharedAirflow.smtp``).
- ``example_txn_kafka_words``, the Kafka example as a user drops it in, reading the topic
  ``words`` of a real Kafka-protocol broker on 127.0.0.1 (Tansu in a process of its own,
  :class:`~txn_testing.kafka.TansuCluster`) through the Airflow connection ``kafka_default``:
  the Kafka test's (``test_kafka_airflow.py``).
- ``fill_words`` (``tests/dags/txn_fill.py``): txids 1..30 committed with the core API before the
  deployment starts; the fill test (``test_fill_airflow.py``) then has its DAG file add an output
  with ``start="history"``, which its fill DAG fills.
- one pipeline per run of the Airflow chaos suite that CI makes (``chaos/dags/chaos_words.py``,
  its runs in ``CHAOS_IN_CI``): ``test_chaos_airflow.py`` causes its fault on this deployment, not
  on one of its own (a second deployment's start took over three minutes inside ``make test``).

Every Airflow process sends OpenLineage events through the OpenLineage provider's file transport
into ``lineage/`` (one file per event): the Kafka and credentials tests read what the pipelines'
tasks sent, and check it as an independent consumer would (``SharedAirflow.check_lineage``).

Two users sign in: the admin, and ``viewer`` (the simple auth manager's role ``viewer``: reads
every DAG, edits none), whom the browser test's rewind is refused.

The DAGs start paused; each test unpauses its own, and pauses it and ends its runs when done, so
the other tests run beside idle pipelines. The deployment stops after the last test that uses
it (not at the session's end: the other tests that start an Airflow run on the same xdist worker
after them; ``tests/conftest.py`` runs these first).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_txn_provider.utils.lineage import PRODUCER, RUN_FACET, SCHEMAS
from chaos.on_airflow import Deployment, Plan, plan_runs, prepare_runs
from tests.conftest import new_database
from tests.spark_data import parquet_dataset, random_lines
from txn_testing.airflow import AirflowStack, txn_log_connection_env
from txn_testing.kafka import KafkaCluster, TansuCluster
from txn_testing.openlineage import facets_of, lifecycle_problems, set_from_outside, spec_schemas
from txn_testing.smtp import SmtpServer
from txn_testing.statsd import StatsdListener

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "example_txn_words.py"
KAFKA_EXAMPLE = ROOT / "dags" / "example_txn_kafka_words.py"
KAFKA_TOPIC = "words"  # the example's default topic
EXAMPLE_HELPER = "txn_examples.py"  # the examples' data generators, beside them in dags/
TEST_DAG = ROOT / "tests" / "dags" / "txn_words.py"
FILL_DAG = ROOT / "tests" / "dags" / "txn_fill.py"
FILL_PIPELINE = "fill_words"
FILL_HISTORY = 30
"""Txids of ``fill_words`` committed before the deployment starts; its fill computes them one by
one (``chunk=1``), long enough for the page to be seen while it fills."""
CHAOS_DAG = ROOT / "chaos" / "dags" / "chaos_words.py"

# The credentials test's pipeline (see tests/integration/on_airflow/test_credentials.py)
SECRET_PIPELINE = "secret_words"
SECRET_BATCH = 20
SECRET_MARK = "leakmarker"
"""The job raises an error carrying the catalog's URL, password included, on a line with it."""
SECRET_CATALOG_CONN = "ice_cat"
STALL_ALERT_AFTER = 10
"""Seconds without progress after which ``secret_words`` alerts a stall (its poison batch's)."""

LEGACY_FACETS = ("txn", "txnBatch")
"""The keys the provider's facets had before they were prefixed (issue 46)."""

# The Airflow chaos suite (chaos/on_airflow.py): its fixed-seed list of runs, and the one CI makes
# here (each keeps the seed it draws in the whole list). The others run in make test-scenarios,
# on a deployment of their own whose Postgres servers they crash (test_chaos_airflow.py).
CHAOS_SEED = 2026
CHAOS_FAULTS = (
    "kill_processing",
    "cascade_herd",
    "restart_log_postgres",
    "kill_scheduler",
    "kill_processing@delta",  # appended: the four runs above keep their seeds
    "kill_log_backend",  # appended too; its seed draws the "processed" moment (staged rows lost)
)
CHAOS_IN_CI = ("kill_processing",)
"""The run ``make test`` makes: a task process killed (its txid fails, the later ones in flight
with it, and the failure sensors re-queue them: a cascade). The log's Postgres restarted and the
backend kills have CI runs without Airflow (``test_chaos_fast.py``)."""

# A second user of the deployment, who may read every DAG but edit none (the simple auth
# manager's role ``viewer``): the browser test's user whom a rewind is refused.
VIEWER_USER = "viewer"
VIEWER_PASSWORD = "viewer-password"


@dataclass
class SharedAirflow:
    stack: AirflowStack
    db_url: str
    """The transaction log both pipelines write."""
    folder: Path
    """The deployment's folder: ``airflow/`` (its home), ``data/``, ``warehouse/``."""
    kafka: KafkaCluster
    """The cluster of ``example_txn_kafka_words`` (``kafka_default``)."""
    statsd: StatsdListener
    """Where every Airflow process of the deployment sends its StatsD metrics (and ours)."""
    lineage: Path
    smtp: SmtpServer
    """Where ``secret_words``' alerts are mailed."""
    """The OpenLineage file transport writes ``<lineage>-<timestamp>.json``, one per event."""
    chaos: Deployment
    """The deployment as the Airflow chaos suite sees it (no Postgres of its own to crash)."""
    chaos_plans: list[Plan]
    """The runs of ``CHAOS_IN_CI``, a DAG each (paused)."""
    users: int = 0
    """Tests of this session that use it and have not finished."""
    stopped: bool = field(default=False)
    ended_by_tests: set[tuple[str, str, str | None, int | None]] = field(default_factory=set)
    """``(dag_id, run_id, task_id, try_number)`` of each run (task ``None``) and each unfinished
    task try that :meth:`idle` ended from outside. Their terminal events are the api-server's
    listener's, not the pipeline's, and may not come: in one CI run none of them arrived within
    a minute, on a loaded machine, while every event of the pipeline's own tasks did."""

    @contextlib.contextmanager
    def running(self, dag_id: str) -> Iterator[None]:
        """``dag_id`` unpaused, then idle again (:meth:`idle`)."""
        self.stack.client().unpause(dag_id)
        try:
            yield
        finally:
            self.idle(dag_id)

    def idle(self, dag_id: str) -> None:
        """Pause ``dag_id`` and end its unfinished runs: the next test runs beside no task and
        no deferred sensor of it (a paused DAG's runs in flight would wait, polling, forever)."""
        api = self.stack.client()
        api.pause(dag_id)
        for run in api.runs(dag_id):
            if run["state"] in ("queued", "running"):
                run_id = run["dag_run_id"]
                self.ended_by_tests.add((dag_id, run_id, None, None))
                for ti in api.task_instances(dag_id, run_id):
                    if ti["state"] not in ("success", "failed", "skipped", "removed"):
                        self.ended_by_tests.add((dag_id, run_id, ti["task_id"], ti["try_number"]))
                api.call("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})

    def _events(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every OpenLineage event the file transport wrote, oldest first, and the files that do
        not parse (yet: the transport creates a file, then writes it)."""
        events, unreadable = [], []
        for path in sorted(self.lineage.parent.glob(f"{self.lineage.name}-*.json")):
            try:
                events.append(json.loads(path.read_text()))
            except ValueError:
                unreadable.append(path.name)
        return events, unreadable

    def lineage_events(self, dag_id: str) -> list[dict[str, Any]]:
        """The OpenLineage run events of ``dag_id``'s tasks that say which txid they worked for
        (the provider's run facet), oldest first."""
        events = []
        for event in self._events()[0]:
            if event.get("job", {}).get("name", "").startswith(f"{dag_id}.") and RUN_FACET in (
                event.get("run", {}).get("facets", {})
            ):
                events.append(event)
        return events

    def dag_lineage(self, dag_id: str) -> list[dict[str, Any]]:
        """Every OpenLineage event of ``dag_id``'s runs and their tasks'."""
        events = []
        for event in self._events()[0]:
            job = event.get("job", {}).get("name", "")
            if job == dag_id or job.startswith(f"{dag_id}."):
                events.append(event)
        return events

    def check_lineage(self, dag_id: str, timeout: float = 60) -> list[dict[str, Any]]:
        """``dag_id``'s events (once it is idle: each run ended) checked as a lineage consumer
        reads them: each valid against the spec's RunEvent schema and every facet against its
        own schema (the provider's facets against those it ships, naming it as producer); each
        run begun with START and ended once. Waits ``timeout`` for events still on their way."""
        schemas = spec_schemas(SCHEMAS)
        ours = {json.loads(f.read_text())["$id"] for f in SCHEMAS.glob("*.json")}

        def problems() -> list[str]:
            events = self.dag_lineage(dag_id)
            found = [f"{e['job']['name']} {p}" for e in events for p in schemas.problems(e)]
            found += [f"{name} is not JSON" for name in self._events()[1]]
            for event in events:
                for where, key, facet in facets_of(event):
                    url = str(facet.get("_schemaURL")).split("#")[0]
                    if key.startswith("airflowTxn_") or url in ours or key in LEGACY_FACETS:
                        if not key.startswith("airflowTxn_") or url not in ours:
                            found.append(f"{where}.{key} names schema {url}, not its own")
                        if facet.get("_producer") != PRODUCER:
                            found.append(f"{where}.{key} has producer {facet.get('_producer')}")
            return found + lifecycle_problems(
                events, outside=set_from_outside, ended_silently=self._ended_silently
            )

        deadline = time.monotonic() + timeout
        while (found := problems()) and time.monotonic() < deadline:
            time.sleep(2)
        assert not found, f"{dag_id}'s lineage:\n" + "\n".join(found[:40])
        return self.dag_lineage(dag_id)

    def _ended_silently(self, run: list[dict[str, Any]]) -> bool:
        """Whether Airflow ended this task try neither by success nor by failure: skipped
        while it waited to resume (its run marked failed through the REST API: a rewind, a
        test's cleanup) or cleared while deferred; its listener sends no event for either.
        A try that succeeded or failed must have sent its own. A run that :meth:`idle` ended,
        and a try it found unfinished there, need none of their own."""
        facets = [e["run"]["facets"] for e in run]
        dag_runs = [f["airflowDagRun"] for f in facets if "airflowDagRun" in f]
        if dag_runs:
            dag_run = dag_runs[0]["dagRun"]
            return (dag_runs[0]["dag"]["dag_id"], dag_run["run_id"], None, None) in (
                self.ended_by_tests
            )
        facet = next((f["airflow"] for f in facets if "airflow" in f), None)
        if facet is None:
            return False
        dag_run, task = facet["dagRun"], facet["task"]["task_id"]
        number = facet["taskInstance"]["try_number"]
        if (dag_run["dag_id"], dag_run["run_id"], task, number) in self.ended_by_tests:
            return True
        path = f"/dags/{dag_run['dag_id']}/dagRuns/{dag_run['run_id']}/taskInstances/{task}/tries"
        tries = self.stack.client().call("GET", path)["task_instances"]
        states = [t["state"] for t in tries if t["try_number"] == number]
        return bool(states) and states[-1] not in ("success", "failed")

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            try:
                self.stack.stop()
            finally:
                self.kafka.stop()
                self.statsd.stop()
                self.smtp.stop()


def fill_lines() -> dict[str, list[str]]:
    """``fill_words``' data: 2 partitions of 36 txids' lines (single spaces between words)."""
    return {str(p): random_lines(90 + p, 36 * 10) for p in (0, 1)}


def commit_fill_history(db_url: str, folder: Path) -> Path:
    """``fill_words``' first ``FILL_HISTORY`` txids, committed with the core API before its DAG
    file is parsed: word counts only (computed in Python, as a job of the version before this
    one staged them); returns the data's folder."""
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.state import MapState, stage_states
    from airflow_txn_provider.transactions.commit import commit_registered
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from tests.spark_data import lines_in_ranges, word_counts

    data = fill_lines()
    path = parquet_dataset(folder, data, file_rows=10)
    source = PartitionedParquetSource(str(path), 10)
    txlog = TransactionLog.from_url(db_url, migrate=False)
    counts = MapState(
        FILL_PIPELINE, f"{FILL_PIPELINE}_counts", "transactional", keys={"word": "text"}
    )
    txlog.ensure_pipeline(
        FILL_PIPELINE,
        source_kind="transactional",
        max_pending=2,
        dag_id=FILL_PIPELINE,
        states=[counts],
    )
    for _ in range(FILL_HISTORY):
        e = txlog.begin_next(FILL_PIPELINE, source)
        rows = list(word_counts(lines_in_ranges(data, e.metadata)).items())
        txlog.stage_output(
            FILL_PIPELINE,
            e.txid,
            e.attempt,
            lambda conn, e=e, rows=rows: stage_states(conn, e.txid, e.attempt, {counts: rows}),
        )
        assert commit_registered(txlog, FILL_PIPELINE, e.txid, e.attempt).applied
    txlog.engine.dispose()
    return path


@pytest.fixture(scope="session")
def _shared_airflow_deployment(
    request: pytest.FixtureRequest,
    postgres,
    connect_server,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SharedAirflow]:
    folder = tmp_path_factory.mktemp("shared-airflow")
    db_url = new_database(postgres)
    dags = folder / "dags"
    dags.mkdir()
    sources = (EXAMPLE, EXAMPLE.with_name(EXAMPLE_HELPER), TEST_DAG, KAFKA_EXAMPLE, CHAOS_DAG)
    for source in (*sources, FILL_DAG):
        (dags / source.name).symlink_to(source)
    fill_data = commit_fill_history(db_url, folder / "data" / "fill")
    chaos_plans = [p for p in plan_runs(CHAOS_FAULTS, CHAOS_SEED) if p.label in CHAOS_IN_CI]
    kafka = TansuCluster().start()
    statsd = StatsdListener().start()
    smtp = SmtpServer().start()
    lineage = folder / "lineage" / "event"
    lineage.parent.mkdir()
    lines = random_lines(26, 3 * SECRET_BATCH)
    lines[SECRET_BATCH + 5] = f"a {SECRET_MARK} line"  # in txid 2's batch
    env = {
        **txn_log_connection_env("txn_log_default", db_url),
        # example_txn_words
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": connect_server.url,
        "TXN_EXAMPLES_DATA": str(folder / "data" / "examples"),
        # secret_words (tests/dags/txn_words.py); max_attempts=1: its first failure is a poison
        # batch (a second attempt would be another spark-submit, ~1 min, and check no more)
        "TXN_TEST_PIPELINE": SECRET_PIPELINE,
        "TXN_TEST_DATA": str(parquet_dataset(folder / "data" / "secret", {"0": lines})),
        "TXN_TEST_BATCH": str(SECRET_BATCH),
        "TXN_TEST_MAX_PENDING": "2",
        "TXN_TEST_MAX_ATTEMPTS": "1",
        "TXN_TEST_SPARK": "submit",
        "TXN_TEST_JOB": str(ROOT / "tests" / "spark_jobs" / "leaky_word_count.py"),
        "TXN_TEST_ICEBERG_CONN": SECRET_CATALOG_CONN,
        "TXN_TEST_ICEBERG_WAREHOUSE": str(folder / "warehouse"),
        # its alerts, by mail to an SMTP server the tests own on 127.0.0.1
        "TXN_TEST_ALERT_SMTP_CONN": "alert_smtp",
        "AIRFLOW_CONN_ALERT_SMTP": smtp.connection(),
        "TXN_TEST_STALL_ALERT_AFTER": str(STALL_ALERT_AFTER),
        # fill_words (tests/dags/txn_fill.py): an output added to it, filled from history
        "TXN_FILL_DATA": str(fill_data),
        "TXN_FILL_ADDED": str(folder / "fill-added"),
        # example_txn_kafka_words: the Kafka provider's connection type, its Config Dict in extra
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka.config}),
        "TXN_EXAMPLES_KAFKA_TOPIC": KAFKA_TOPIC,
        # the Airflow chaos suite's CI run (chaos/dags/chaos_words.py)
        "TXN_CHAOS_RUNS": json.dumps(prepare_runs(chaos_plans, folder / "chaos")),
        # metrics, Airflow's and the provider's, to a StatsD server the tests own on 127.0.0.1
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": statsd.host,
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        # lineage, through the OpenLineage provider's file transport
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(lineage), "append": False}
        ),
    }
    meta = new_database(postgres, migrated=False)  # Airflow's metadata database
    stack = AirflowStack(
        folder / "airflow", meta, dags, env=env, users={VIEWER_USER: ("viewer", VIEWER_PASSWORD)}
    )
    chaos = Deployment(None, None, connect_server, stack, db_url, folder / "chaos")
    deployment = SharedAirflow(
        stack, db_url, folder, kafka, statsd, lineage, smtp, chaos, chaos_plans
    )
    deployment.users = sum("shared_airflow" in item.fixturenames for item in request.session.items)
    try:
        deployment.stack.start()
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def shared_airflow(_shared_airflow_deployment: SharedAirflow) -> Iterator[SharedAirflow]:
    """The shared deployment; stopped once the last test of the session that uses it is done."""
    deployment = _shared_airflow_deployment
    assert not deployment.stopped, "the shared Airflow deployment was stopped before this test"
    try:
        yield deployment
    finally:
        deployment.users -= 1
        if deployment.users <= 0:
            deployment.stop()
