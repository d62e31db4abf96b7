"""The code in the docs runs: docs/sources.md's worked source, through a real job and commit."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from airflow_txn_provider.operators.spark_runner import load_job_module
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import word_counts

ROOT = Path(__file__).resolve().parents[3]


def _python_blocks(markdown: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown.read_text(), flags=re.S)


def test_daily_csv_source_from_the_docs(txlog, spark, tmp_path):
    (block,) = [b for b in _python_blocks(ROOT / "docs" / "sources.md") if "DailyCsvSource" in b]
    module = types.ModuleType("docs_sources")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(block, "docs/sources.md", "exec"), module.__dict__)
    source = module.DailyCsvSource(str(tmp_path), days=2)

    days = {f"2026-11-0{d}": [f"w{d} common", f"x{d}"] for d in range(1, 6)}
    for day, lines in days.items():
        (tmp_path / f"{day}.csv").write_text("line\n" + "\n".join(lines) + "\n")
    txlog.register_pipeline("daily", source_kind="transactional", max_pending=3)
    state = MapState("daily", "daily_words", keys={"word": "text"}).create(txlog.engine)
    transform = load_job_module(ROOT / "spark_jobs" / "word_count.py").transform

    emissions = []
    while (e := txlog.begin_next("daily", source)) is not None and e.emitted:
        emissions.append(e)
        process_batch(spark, txlog, BatchJob("daily", e.txid, e.attempt, source), transform)
        commit_registered(txlog, "daily", e.txid, e.attempt)
    assert [e.metadata["days"] for e in emissions] == [
        ["2026-11-01", "2026-11-02"],
        ["2026-11-03", "2026-11-04"],
        ["2026-11-05"],
    ]
    with txlog.engine.connect() as conn:
        got = {k[0]: v for k, v in state.items(conn).items()}
    assert got == dict(word_counts(line for lines in days.values() for line in lines))


def test_pipeline_declaration_in_the_airflow_docs_builds_its_dag():
    (block,) = [b for b in _python_blocks(ROOT / "docs" / "airflow.md") if "build_dag" in b]
    namespace: dict = {}
    exec(compile(block, "docs/airflow.md", "exec"), namespace)
    dag = namespace["dag"]
    from airflow_txn_provider.rules.config import FITTED_WINDOW_BOUND, RUNS_AHEAD

    # the window's bound (it fits the Spark), and the runs ahead
    assert dag.dag_id == "words" and dag.max_active_runs == FITTED_WINDOW_BOUND + RUNS_AHEAD
    assert set(dag.task_ids) == {"process_word_count", "commit", "watch_failures"}


def test_the_airflow_docs_name_the_preload_switch_airflow_reads():
    from airflow_txn_provider.get_provider_info import get_provider_info
    from airflow_txn_provider.preload import PRELOAD_OPTION

    options = get_provider_info()["config"]["txn_provider"]["options"]
    assert PRELOAD_OPTION in options and options[PRELOAD_OPTION]["default"] == "True"
    text = (ROOT / "docs" / "airflow.md").read_text()
    blocks = re.findall(r"```ini\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "preload" in b]
    assert block.split() == ["[txn_provider]", PRELOAD_OPTION, "=", "False"]
