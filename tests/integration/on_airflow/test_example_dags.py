"""The example DAGs in ``dags/``: each imports cleanly and runs with ``dag.test()`` on a real
Postgres log and a real Spark Connect server, and its committed state equals ground truth.

Each txid is one manual run naming its txid in conf (as in ``test_dag_test.py``).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from airflow_txn_provider.state import load_states
from airflow_txn_provider.timetables import txid_logical_date
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from tests.conftest import load_dag_file, set_txn_log_connection
from txn_examples import landing_lines, set_partition_online

DAGS = Path(__file__).resolve().parents[3] / "dags"
EXAMPLES = sorted(p.name for p in DAGS.glob("example_*.py"))  # not txn_examples.py, a helper
DOWNSTREAM = {"example_txn_lake_downstream"}
"""Example DAGs that are not transaction pipelines (they run on a pipeline's Asset events)."""


@pytest.fixture
def example_env(db_url, tmp_path, connect_server, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", connect_server.url)
    monkeypatch.setenv("TXN_EXAMPLES_DATA", str(tmp_path / "examples"))
    set_txn_log_connection(monkeypatch, "txn_log_default", db_url)
    txlog = TransactionLog.from_url(db_url)
    yield txlog
    txlog.engine.dispose()


def _run(dag, txid: int, expect: str = "success"):
    run = dag.test(logical_date=txid_logical_date(txid), run_conf={"txid": txid})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == expect, states
    return states


def _committed(txlog: TransactionLog, pipeline: str, name: str) -> dict:
    engine = create_engine(txlog.engine.url)
    try:
        with engine.connect() as conn:
            return load_states(conn, pipeline)[name].items(conn)
    finally:
        engine.dispose()


def _lines(metadata_list: list[dict]) -> int:
    return sum(end - start for m in metadata_list for start, end in m.values())


def test_every_example_imports_with_a_docstring(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    assert len(EXAMPLES) >= 3, EXAMPLES
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert len(bag.dags) == len(EXAMPLES)
    for dag in bag.dags.values():
        assert "example" in dag.tags
        assert dag.doc_md and len(dag.doc_md.strip().splitlines()) > 5, dag.dag_id
        if dag.dag_id in DOWNSTREAM:
            continue
        assert {"commit", "watch_failures"} <= set(dag.task_ids)
        assert any(t.startswith("process_") for t in dag.task_ids)


def test_words_example_commits_counts_and_buckets(airflow_db, example_env):
    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_words.py")
    name = module.NAME
    for txid in (1, 2, 3):
        states = _run(module.dag, txid)
        assert states["commit"] == "success"
    txids = txlog.transactions(name)
    assert [t.txid for t in txids] == [1, 2, 3]
    assert all(t.status.value == "committed" for t in txids)
    for before, after in itertools.pairwise(txids):  # ranges tile: nothing lost
        assert {p: r[0] for p, r in after.metadata.items()} == {
            p: r[1] for p, r in before.metadata.items()
        }
    counts = {k[0]: v for k, v in _committed(txlog, name, f"{name}_counts").items()}
    words_per_line = module.txn_pipeline.source.words_per_line
    assert sum(counts.values()) == words_per_line * _lines([t.metadata for t in txids])
    # The bucket state, derived at each commit, matches the final counts bucketed at once.
    buckets = {k[0]: v for k, v in _committed(txlog, name, f"{name}_buckets").items() if v}
    assert buckets == dict(Counter(c // 10 for c in counts.values()))


def test_global_count_example_counts_every_committed_line_once(airflow_db, example_env):
    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_global_count.py")
    name = module.NAME
    for txid in (1, 2):
        _run(module.dag, txid)
    _run(module.dag, 2)  # a rerun of a committed txid changes nothing
    txids = txlog.transactions(name)
    assert [t.status.value for t in txids] == ["committed", "committed"]
    total = _committed(txlog, name, f"{name}_total")
    assert total == {(True,): _lines([t.metadata for t in txids])}


def test_opaque_example_stays_exact_when_a_partition_is_lost_during_a_replay(
    airflow_db, example_env, monkeypatch, tmp_path
):
    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_opaque_words.py")
    name = module.NAME
    landing = tmp_path / "examples" / "opaque_landing"
    _run(module.dag, 1)
    monkeypatch.setenv("AIRFLOW__TXN_PROVIDER__FAILURE_INJECTION", "True")
    monkeypatch.setenv(f"AIRFLOW_VAR_TXN_INJECT_FAILURE__{name.upper()}", "2")
    states = _run(module.dag, 2, expect="failed")
    assert states["process_word_count"] == "failed"
    first_attempt = txlog.attempts(name, 2)[0]
    assert first_attempt.metadata["p1"][1] > first_attempt.metadata["p1"][0]  # it read p1

    set_partition_online(landing, "p1", online=False)  # p1 is lost before the replay
    monkeypatch.delenv(f"AIRFLOW_VAR_TXN_INJECT_FAILURE__{name.upper()}")
    _run(module.dag, 2)
    replay = txlog.transaction(name, 2)
    assert replay.attempt == 2 and replay.status.value == "committed"
    assert replay.metadata["p1"][0] == replay.metadata["p1"][1]  # a different batch: no p1
    assert replay.metadata != first_attempt.metadata

    set_partition_online(landing, "p1", online=True)
    _run(module.dag, 3)
    txids = txlog.transactions(name)
    assert txids[-1].metadata["p1"][0] == first_attempt.metadata["p1"][0]  # p1 resumes

    read = [
        json.loads(line)["line"]
        for t in txids
        for partition, (start, end) in t.metadata.items()
        for seq in range(start, end)
        for line in landing_lines(partition, seq)
    ]
    counts = {k[0]: v for k, v in _committed(txlog, name, f"{name}_counts").items()}
    assert counts == dict(Counter(w for line in read for w in line.split()))


def _asset_events(name: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == name)
            .order_by(AssetEvent.id)
        ).all()
    return [dict(r.extra or {}) for r in rows]


def test_delta_example_appends_each_txid_once_and_feeds_the_downstream_dag(airflow_db, example_env):
    import pyarrow.compute as pc

    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_delta_words.py")
    name, sink = module.NAME, module.SINK
    for txid in (1, 2, 3):
        _run(module.dag, txid)
    _run(module.dag, 2)  # a rerun of a committed txid adds nothing
    txids = txlog.transactions(name)
    assert [t.status.value for t in txids] == ["committed"] * 3
    table = sink.open()
    assert table.committed_txid(name) == 3
    rows = table.read(table.version_as_of(name, 3))
    words_per_line = module.txn_pipeline.source.words_per_line
    for t in txids:  # each txid's rows: exactly its batch's words, each word once
        mine = rows.filter(pc.equal(rows["txid"], t.txid)).to_pylist()
        assert sum(r["delta"] for r in mine) == words_per_line * _lines([t.metadata])
        assert len({r["word"] for r in mine}) == len(mine)
    versions = dict(table.versions(name))
    for t in txids:  # the version each txid committed as is in its record (the page shows it)
        assert t.output[sink.output_key]["commit"]["version"] == versions[t.txid]
    # One Asset event per committed txid, naming it and its table version.
    events = _asset_events(f"txn:{name}:word_counts")
    assert sorted(e["txid"] for e in events) == [1, 2, 3]
    assert all(e["version"] == versions[e["txid"]] and e["pipeline"] == name for e in events)

    downstream = load_dag_file(DAGS / "example_txn_lake_downstream.py")
    run = downstream.dag.test()
    assert run.state == "success"
    summary = _xcom(run, "summarize")
    assert summary["txid"] == 3 and summary["rows"] == rows.num_rows
    assert summary["words"] == words_per_line * _lines([t.metadata for t in txids])


def _xcom(run, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == run.dag_id,
                XComModel.run_id == run.run_id,
                XComModel.task_id == task_id,
                XComModel.key == "return_value",
            )
        ).scalar_one()
    return json.loads(value) if isinstance(value, str) else value


def test_iceberg_example_merges_the_newest_count_of_each_word(airflow_db, example_env, tmp_path):
    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_iceberg_words.py")
    name, sink = module.NAME, module.SINK
    for txid in (1, 2, 3):
        _run(module.dag, txid)
    txids = txlog.transactions(name)
    assert [t.status.value for t in txids] == ["committed"] * 3
    expected: dict[str, tuple[int, int]] = {}
    for t in txids:  # plain Python: the newest txid a word appeared in, and its count there
        lines = [
            json.loads(line)["line"]
            for partition, (start, end) in t.metadata.items()
            for seq in range(start, end)
            for line in landing_lines(partition, seq)
        ]
        for word, n in Counter(w for line in lines for w in line.split()).items():
            expected[word] = (t.txid, n)
    table = sink.open(str(txlog.engine.url.render_as_string(hide_password=False)))
    assert table.committed_txid(name) == 3
    rows = table.read(table.version_as_of(name, 3)).to_pylist()
    assert len(rows) == len(expected)
    assert {r["word"]: (r["txid"], r["delta"]) for r in rows} == expected


def test_audited_example_publishes_what_passed_and_quarantines_the_stop_words(
    airflow_db, example_env
):
    """Committed + quarantined = each batch's words, exactly; no stop word is published; every
    txid's outcomes are recorded with the drop's count equal to its quarantined rows."""
    from airflow_txn_provider.log.expectations import quarantined

    txlog = example_env
    module = load_dag_file(DAGS / "example_txn_audited_words.py")
    name = module.NAME
    for txid in (1, 2, 3):
        assert _run(module.dag, txid)["commit"] == "success"
    txids = txlog.transactions(name)
    assert [t.status.value for t in txids] == ["committed"] * 3
    counts = {k[0]: v for k, v in _committed(txlog, name, module.COUNTS).items()}
    with txlog.engine.connect() as conn:
        dropped = quarantined(conn, name, limit=10_000)
    assert counts and dropped and not set(counts) & set(module.STOP_WORDS)
    assert {r.row["word"] for r in dropped} <= set(module.STOP_WORDS)
    words_per_line = module.txn_pipeline.source.words_per_line
    in_batches = words_per_line * _lines([t.metadata for t in txids])
    assert sum(counts.values()) + sum(r.row["delta"] for r in dropped) == in_batches
    for t in txids:
        outcomes = {o["expectation"]: o for o in txlog.attempts(name, t.txid)[-1].expectations}
        assert set(outcomes) == {
            "stop words",
            "frequent word",
            "batch size",
            "words in every batch",
        }
        mine = [r for r in dropped if r.txid == t.txid]
        assert outcomes["stop words"]["rows_failed"] == len(mine)
        assert outcomes["stop words"]["taken"] == ("dropped" if mine else "passed")
        assert outcomes["words in every batch"]["taken"] == "passed"
