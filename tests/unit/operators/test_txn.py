"""Operator-layer rules that need no services: telling an Airflow retry from a first try."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jinja2.nativetypes import NativeEnvironment
from jinja2.sandbox import SandboxedEnvironment

from airflow_txn_provider.operators.txn import is_airflow_retry, is_plain_text


@pytest.mark.parametrize(
    ("try_number", "max_tries", "retries", "expected"),
    [
        (1, 12, 12, False),  # the run's first try
        (2, 12, 12, True),  # Airflow retrying it
        (13, 12, 12, True),  # its last retry
        (3, 14, 12, False),  # cleared after try 2: max_tries = 2 + retries
        (4, 14, 12, True),  # and retried after that
        (1, 0, 0, False),  # a task without retries
        (2, 1, 0, False),  # ... cleared once
    ],
)
def test_is_airflow_retry(try_number, max_tries, retries, expected):
    ti = SimpleNamespace(try_number=try_number, max_tries=max_tries)
    assert is_airflow_retry(ti, retries) is expected


# -- a processing task that committed its own txid ends its run -----------------------------------


def _process_task(**pipeline_kw):
    from airflow_txn_provider.dag_builder import build_dag
    from airflow_txn_provider.pipeline import TxnPipeline
    from airflow_txn_provider.sources.parquet import PartitionedParquetSource
    from airflow_txn_provider.state import MapState

    pipeline_kw.setdefault("states", [MapState("words", "word_counts", keys={"word": "text"})])
    txn_pipeline = TxnPipeline(
        name="words",
        source=PartitionedParquetSource("/data/words"),
        jobs=["spark_jobs/word_count.py"],
        **pipeline_kw,
    )
    return build_dag(txn_pipeline).get_task("process_word_count")


def _context(run_id):
    pushed = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value))
    return {"dag_run": SimpleNamespace(run_id=run_id), "ti": ti}, pushed


def _run_execute(task, context, committed, monkeypatch, in_turn=(False, []), waited=None):
    import airflow_txn_provider.operators.txn as txn

    def commit_in_turn(log, pipeline, txid, logger):
        if waited is not None:
            waited.append(txid)
        return in_turn

    monkeypatch.setattr(txn, "commit_in_turn", commit_in_turn)
    claim = {"txid": 7, "attempt": 1, "metadata": {}}

    def fake_claim(self, ctx, publish=True):  # what the claim remembers, published or not
        self._lineage_claim = claim
        return claim

    monkeypatch.setattr(type(task), "claim", fake_claim)
    monkeypatch.setattr(type(task), "_process", lambda self, ctx, c: {"status": "processed"})
    monkeypatch.setattr(type(task), "txlog", lambda self: None)
    monkeypatch.setattr(txn, "commit_ready", lambda log, p, logger: committed)
    monkeypatch.setattr(txn, "prune_airflow_runs", lambda *a: None)
    return task.execute(context)


def test_a_task_that_committed_its_txid_skips_the_runs_commit_and_watch(monkeypatch):
    from airflow_txn_provider.compat.airflow import DownstreamTasksSkipped

    task = _process_task()
    context, pushed = _context("txid-000007")
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        _run_execute(task, context, [7, 8], monkeypatch)
    assert skipped.value.tasks == ["commit", "watch_failures"]
    # nothing reads the claim or a return value once the run ends: no request for either
    assert pushed == {}


def test_a_task_whose_txid_commits_while_it_waits_its_turn_ends_its_run(monkeypatch):
    from airflow_txn_provider.compat.airflow import DownstreamTasksSkipped

    context, pushed = _context("txid-000007")
    waited: list[int] = []
    with pytest.raises(DownstreamTasksSkipped):
        # txid 6 still processed: its task committed 6 and 7 while this one waited
        _run_execute(_process_task(), context, [], monkeypatch, (True, []), waited)
    assert waited == [7] and pushed == {}


def test_the_run_goes_on_when_the_txid_waits_or_the_commit_has_work(monkeypatch):
    context, pushed = _context("txid-000007")
    # an earlier txid not committed within the wait: the commit task commits it later
    waited: list[int] = []
    assert _run_execute(_process_task(), context, [], monkeypatch, waited=waited)["committed"] == []
    assert waited == [7]
    assert pushed == {"claim": {"txid": 7, "attempt": 1, "metadata": {}}}  # for its commit task
    # a manual run (dag.test): its commit task runs as before
    manual, _ = _context("manual__2026-01-01")
    assert _run_execute(_process_task(), manual, [7], monkeypatch)["committed"] == [7]
    # lake sinks: the commit task emits their Asset events
    from airflow_txn_provider.sinks import DeltaSink

    with_sink = _process_task(sinks=[DeltaSink("t", table_uri="/tmp/t")], states=[])
    assert not with_sink.ends_its_run(context)


class _CountingEnv(SandboxedEnvironment):
    """Airflow's template environment, counting the templates it compiles."""

    compiled = 0

    def from_string(self, source, *args, **kwargs):
        type(self).compiled += 1
        return super().from_string(source, *args, **kwargs)


def _rendered(task, value, env):
    _CountingEnv.compiled = 0
    out = task.render_template(value, {"ds": "2026-11-29"}, env)
    return out, _CountingEnv.compiled


def test_a_field_with_no_jinja_is_its_own_rendering_without_a_compile():
    task = _process_task()
    env = _CountingEnv(extensions=["jinja2.ext.do"])
    assert _rendered(task, "spark_jobs/word_count.py", env) == ("spark_jobs/word_count.py", 0)
    assert _rendered(task, "orders.v2", env) == ("orders.v2", 0)
    # Jinja in it, or what Jinja would change: rendered by Airflow
    assert _rendered(task, "jobs/{{ ds }}.py", env) == ("jobs/2026-11-29.py", 1)
    assert _rendered(task, "a {# note #}b", env) == ("a b", 1)
    assert _rendered(task, "name\n", env) == ("name", 1)
    # another syntax set on the DAG's environment is honoured
    custom = _CountingEnv(variable_start_string="[[", variable_end_string="]]")
    assert _rendered(task, "jobs/[[ ds ]].py", custom) == ("jobs/2026-11-29.py", 1)


def test_a_native_rendering_is_left_to_airflow():
    task = _process_task()
    assert not is_plain_text("12", NativeEnvironment(), task)
    assert is_plain_text("12", SandboxedEnvironment(), task)
