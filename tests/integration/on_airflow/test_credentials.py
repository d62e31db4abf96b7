"""A planted catalog password never shows: not in ``ps``, a task log, the log's tables, the
Transactions page or a run note. On a real Airflow (scheduler, dag-processor, triggerer,
api-server on a Postgres metadata DB) running its jobs with ``spark-submit``: the deployment
``shared_airflow`` (``tests/integration/conftest.py``), which the browser test uses too.

The pipeline ``secret_words`` commits into an Iceberg table whose catalog is the Airflow
connection ``ice_cat``, created in Airflow's metadata database through the REST API, as a person
would in Admin > Connections, with a password this test plants. Txid 1 commits through it (so the
connection is really used, by the job's driver and by the commit). Txid 2's batch holds a marked
line, on which the job raises an error carrying the catalog's URL, password included: with
``max_attempts=1`` that is a poison batch at once, whose error is stored, shown on the page and
copied into the run's note, and whose failure re-queues txid 3. The pipeline's alerts (an
``SmtpNotifier``) mail the poison batch and the stall behind it, once each, with the password
replaced too; its OpenLineage events name the table (by its location, its catalog's name as a
symlink) and the failed batch, never the password, and follow the spec's schemas.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url

from airflow_txn_provider.log.alerts import ALERT_CHECK_EVERY
from airflow_txn_provider.sinks import IcebergSink
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.utils.lineage import BATCH_FACET, RUN_FACET
from tests.conftest import wait_until
from tests.integration.conftest import SECRET_CATALOG_CONN, SECRET_PIPELINE

PIPELINE = SECRET_PIPELINE
SECRET = "Pl4nted-catalog-S3cret"


class ProcessWatch(threading.Thread):
    """Samples every process's command line, and the environment of ``spark-submit``'s, as ``ps``
    and a curious user of the machine would, until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.cmdlines: set[str] = set()
        self.submit_environs: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            for proc in Path("/proc").glob("[0-9]*"):
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    if "SparkSubmit" in cmdline and PIPELINE in cmdline:
                        environ = (proc / "environ").read_bytes().decode(errors="replace")
                        self.submit_environs.append(environ)
                except OSError:  # gone, or not ours
                    continue
                self.cmdlines.add(cmdline)


def test_a_planted_catalog_password_shows_nowhere(shared_airflow, monkeypatch):
    stack, db_url = shared_airflow.stack, shared_airflow.db_url
    api = stack.client()
    log_db = make_url(db_url)
    # the catalog: the test's Postgres (trust auth: the password is carried, not checked)
    api.call(
        "POST",
        "/connections",
        json={
            "connection_id": SECRET_CATALOG_CONN,
            "conn_type": "postgres",
            "host": log_db.host,
            "port": log_db.port,
            "login": log_db.username,
            "password": SECRET,
            "schema": log_db.database,
        },
    )
    api.wait_for_dag(PIPELINE)
    watch = ProcessWatch()
    watch.start()
    try:
        api.unpause(PIPELINE)  # idle again below: the shared deployment's other test runs
        txlog = TransactionLog.from_url(db_url, migrate=False)

        def failed_on_the_mark():
            info = txlog.transaction(PIPELINE, 2)
            failed = info is not None and info.status.value == "failed"
            return failed and "refuses it" in (info.last_error or "") and info.last_error

        last_error = wait_until(failed_on_the_mark, 420, "txid 2 to fail on its mark", stack)
        wait_until(lambda: txlog.last_committed(PIPELINE) >= 1, 240, "txid 1 to commit", stack)

        def note():
            runs = {r["dag_run_id"]: r for r in api.runs(PIPELINE)}
            found = (runs.get("txid-000002") or {}).get("note") or ""
            return "POISON BATCH" in found and found

        run_note = wait_until(note, 120, "the poison batch's run note", stack)

        # alerts, mailed to the deployment's SMTP server: the poison batch, and the stall
        # behind it (nothing moves after txid 1 for STALL_ALERT_AFTER seconds)
        def stall_behind_the_poison() -> bool:
            return any(m.subject.endswith("stalled at txid 2") for m in smtp.mails())

        smtp = shared_airflow.smtp
        wait_until(stall_behind_the_poison, 120, "the stall alert's mail", stack)
        time.sleep(2 * ALERT_CHECK_EVERY)  # a second alert of either would come by now
        mails = smtp.mails()
    finally:
        shared_airflow.idle(PIPELINE)
        watch.done.set()
        watch.join()

    # one mail per alert: the poisoned attempt, each stall (the one behind txid 1's commit, and
    # one while txid 1 took longer than STALL_ALERT_AFTER, if it did)
    subjects = [m.subject for m in mails]
    assert len(subjects) == len(set(subjects)), subjects
    poisoned = [m for m in mails if "poisoned" in m.subject]
    poison_subject = f"[airflow-txn] pipeline {PIPELINE}: poisoned at txid 2"
    assert [m.subject for m in poisoned] == [poison_subject]
    assert "POISON BATCH" in poisoned[0].body and "refuses it" in poisoned[0].body
    assert {m.recipients for m in mails} == {("oncall@example.org",)}
    assert all("poisoned" in s or "stalled at txid" in s for s in subjects), subjects
    assert not [m for m in mails if SECRET in m.subject + m.body]

    # the error went everywhere it goes, with the password replaced
    assert "refuses it" in last_error and "***" in last_error and SECRET not in last_error
    assert "POISON BATCH" in run_note and "refuses it" in run_note and SECRET not in run_note

    # ps: the jobs ran (their drivers were seen), the password was in no process's arguments,
    # and it reached the drivers through their environment, as the task handed it over
    assert watch.submit_environs, "no spark-submit driver was seen: the ps check saw nothing"
    assert not [c for c in watch.cmdlines if SECRET in c]
    assert any("TXN_CONN_URL__ICE_CAT=" in e and SECRET in e for e in watch.submit_environs)

    # the catalog connection worked: txid 1 is in the Iceberg table
    monkeypatch.setenv("AIRFLOW_CONN_ICE_CAT", db_url)
    sink = IcebergSink(
        "words_lake",
        table="txn_test.words",
        warehouse=str(shared_airflow.folder / "warehouse"),
        catalog_conn_id=SECRET_CATALOG_CONN,
    )
    assert sink.open().committed_txid(PIPELINE) == 1

    # OpenLineage (the deployment's file transport), as a lineage catalog reads it: every event
    # valid against the spec's schemas and its facets' own, each run ended once (the pipeline
    # idle: the runs it left waiting were ended from outside); txid 1's commit names the
    # Iceberg table at the version it committed; txid 2's failed processing names its batch
    # and no output
    shared_airflow.check_lineage(PIPELINE)

    def lineage_of_txid(txid: int) -> list[dict]:
        events = shared_airflow.lineage_events(PIPELINE)
        return [e for e in events if e["run"]["facets"][RUN_FACET]["txid"] == txid]

    def commit_of_txid_1() -> list[dict]:
        return [e for e in lineage_of_txid(1) if e["outputs"]]

    [commit] = wait_until(commit_of_txid_1, 60, "txid 1's commit in the lineage", stack)
    assert commit["job"]["name"] == f"{PIPELINE}.commit"
    # named by its location, as OpenLineage's Spark integration names an Iceberg table; the
    # catalog's table (its database, never the password) as a symlink
    [table] = [o for o in commit["outputs"] if "symlinks" in o["facets"]]
    location = shared_airflow.folder / "warehouse" / "txn_test.db" / "words"
    assert (table["namespace"], table["name"]) == ("file", str(location))
    catalog = f"postgres://{log_db.host}:{log_db.port}/{log_db.database}"
    assert table["facets"]["symlinks"]["identifiers"] == [
        {"namespace": catalog, "name": "txn.txn_test.words", "type": "TABLE"}
    ]
    committed = txlog.transaction(PIPELINE, 1).output[sink.output_key]["commit"]
    assert table["facets"]["version"]["datasetVersion"] == str(committed["version"])
    failed = [
        e
        for e in lineage_of_txid(2)
        if e["eventType"] == "FAIL" and ".process_" in e["job"]["name"]
    ]
    assert failed, [(e["job"]["name"], e["eventType"]) for e in lineage_of_txid(2)]
    batch = txlog.transaction(PIPELINE, 2).metadata
    assert all(e["inputs"][0]["inputFacets"][BATCH_FACET]["batch"] == batch for e in failed)
    assert not [e for t in (2, 3) for e in lineage_of_txid(t) if e["outputs"]]
    for event in shared_airflow.lineage.parent.iterdir():
        assert SECRET.encode() not in event.read_bytes(), event

    # the log's tables: every row of every txn_ table, as text
    with txlog.engine.connect() as conn:
        tables = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE tablename LIKE 'txn%'")
        ).scalars()
        dump = "\n".join(
            str(row)
            for table in list(tables)
            for row in conn.execute(text(f'SELECT t::text FROM "{table}" t')).scalars()
        )
    assert "refuses it" in dump and SECRET not in dump
    txlog.engine.dispose()

    # the Transactions page, as a signed-in user sees it
    token = httpx.post(
        f"{stack.url}/auth/token",
        json={"username": "admin", "password": stack.password},
        timeout=30,
    ).json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    pages = [
        f"{stack.url}/transactions/pipelines/{PIPELINE}",
        f"{stack.url}/transactions/dags/{PIPELINE}/runs/txid-000002",
    ]
    for url in pages:
        page = httpx.get(url, headers=headers, timeout=30)
        assert page.status_code == 200, (url, page.status_code, page.text[:500])
        assert "refuses it" in page.text and SECRET not in page.text, url

    # every file Airflow wrote: task logs (the driver's traceback carried the URL), the
    # components' own logs, its configuration
    seen_error = False
    for path in stack.home.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert SECRET.encode() not in content, path
            seen_error = seen_error or b"refuses it" in content
    assert seen_error, "no log holds the job's error: the task-log check saw nothing"
