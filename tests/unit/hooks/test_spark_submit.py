"""TxnSparkSubmitHook on the Spark provider's public interface (issue 15): no Spark needed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_txn_provider.hooks.spark_submit import TxnSparkSubmitHook, group_alive


def test_overrides_no_private_method_of_the_provider():
    private = {
        name
        for name, value in vars(TxnSparkSubmitHook).items()
        if name.startswith("_") and not name.startswith("__") and callable(value)
    }
    assert private == set()
    assert {"get_connection", "submit", "on_kill"} <= set(vars(TxnSparkSubmitHook))
    assert all(hasattr(SparkSubmitHook, name) for name in ("get_connection", "submit", "on_kill"))


def test_a_missing_connection_is_local_not_yarn(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_NOWHERE", raising=False)
    hook = TxnSparkSubmitHook(conn_id="spark_nowhere")
    assert hook.master == "local[*]" and hook.deploy_mode is None and not hook.is_remote
    command = hook._build_spark_submit_command("job.py")
    assert command[:3] == ["spark-submit", "--master", "local[*]"]
    assert "yarn" not in " ".join(command)


def test_an_existing_connection_is_the_providers(monkeypatch):
    conn = {"conn_type": "spark", "host": "spark://10.0.0.2", "port": 7077}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", json.dumps(conn))
    hook = TxnSparkSubmitHook(conn_id="spark_standalone", deploy_mode="client")
    assert (hook.master, hook.deploy_mode) == ("spark://10.0.0.2:7077", "client")
    assert hook.get_connection("spark_standalone").host == "spark://10.0.0.2"


def test_submit_runs_in_its_own_session_with_the_environment(fake_popen):
    started = fake_popen
    hook = TxnSparkSubmitHook(conn_id="spark_nowhere", env_vars={"SECRET_URL": "s3cr3t"})
    hook.submit("job.py")
    assert started["start_new_session"] is True
    assert started["env"] == {"SECRET_URL": "s3cr3t"}
    assert "s3cr3t" not in " ".join(started["cmd"])


def test_on_kill_stops_the_whole_process_group():
    hook = TxnSparkSubmitHook(conn_id="spark_nowhere")
    # a stand-in for spark-submit and the driver it starts: a child that outlives its parent
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)",
        ],
        start_new_session=True,
    )
    hook._submit_sp = process  # what the provider's submit records
    deadline = time.monotonic() + 10
    while not _has_child(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    hook.on_kill()
    assert process.poll() is not None
    assert not group_alive(process.pid)


def _has_child(pgid: int) -> bool:
    """Whether process group ``pgid`` has two live processes (the parent and its child)."""
    members = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        members += int(fields[2]) == pgid and fields[0] != "Z"
    return members >= 2


def test_importing_the_runners_does_not_import_airflow():
    code = (
        "import sys, airflow_txn_provider.operators.spark_runner as s; "
        "assert 'airflow' not in sys.modules, [m for m in sys.modules if 'airflow.' in m]; "
        "assert not hasattr(s, 'TxnSparkSubmitHook')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
