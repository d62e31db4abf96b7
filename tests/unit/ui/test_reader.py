"""The one rule of which DAG grants a pipeline (``reader.pipeline_dags``), with plain values: a
pairing the log recorded counts only while its DAG exists and runs that pipeline now."""

from __future__ import annotations

from sqlalchemy.exc import ProgrammingError

from airflow_txn_provider.ui import reader


class FakeLog:
    """The log's pairing methods over a dict: pipeline -> DAG ids recorded as running it."""

    def __init__(self, recorded: dict[str, set[str]], *, writable: bool = True):
        self.recorded = {p: set(ids) for p, ids in recorded.items()}
        self.writable = writable
        self.forgotten: list[list[tuple[str, str]]] = []

    def pipeline_dags(self):
        return {p: set(ids) for p, ids in self.recorded.items() if ids}

    def forget_pipeline_dags(self, pairs):
        pairs = list(pairs)
        self.forgotten.append(pairs)
        if not self.writable:
            raise ProgrammingError("DELETE", {}, Exception("permission denied"))
        for pipeline, dag_id in pairs:
            self.recorded[pipeline].discard(dag_id)
        return len(pairs)


def airflow(dags: dict[str, set[str]]):
    """Airflow's DAGs now: DAG id -> pipelines it declares; a DAG not listed does not exist."""
    asked: list[set[str]] = []

    def dag_pipelines(dag_ids):
        asked.append(set(dag_ids))
        return {d: frozenset(dags[d]) for d in dag_ids if d in dags}

    dag_pipelines.asked = asked  # type: ignore[attr-defined]
    return dag_pipelines


def test_a_pairing_counts_while_its_dag_runs_the_pipeline():
    log = FakeLog({"words": {"words_etl"}, "counts": {"counts"}})
    dags = airflow({"words_etl": {"words"}, "counts": {"counts"}, "unrelated": {"x"}})
    assert reader.pipeline_dags(log, dags) == {
        "words": frozenset({"words_etl"}),
        "counts": frozenset({"counts"}),
    }
    assert dags.asked == [{"words_etl", "counts"}]  # only the recorded DAGs are looked up
    assert log.forgotten == []


def test_a_deleted_dag_grants_nothing_and_its_pairing_is_deleted():
    log = FakeLog({"words": {"words_etl", "words_old"}})
    assert reader.pipeline_dags(log, airflow({"words_etl": {"words"}})) == {
        "words": frozenset({"words_etl"})
    }
    assert log.forgotten == [[("words", "words_old")]]
    assert log.recorded == {"words": {"words_etl"}}


def test_a_reused_dag_id_grants_the_pipeline_it_runs_now_only():
    log = FakeLog({"old": {"etl"}, "new": {"etl"}})
    assert reader.pipeline_dags(log, airflow({"etl": {"new"}})) == {"new": frozenset({"etl"})}
    assert log.forgotten == [[("old", "etl")]]
    # Before the new pipeline's claim ran, the DAG grants neither.
    log = FakeLog({"old": {"etl"}})
    assert reader.pipeline_dags(log, airflow({"etl": {"new"}})) == {}
    assert log.recorded == {"old": set()}


def test_a_dag_that_declares_no_pipeline_grants_nothing_and_keeps_its_pairing():
    """Serialized by a version before the declaration (until the DAG processor parses it again),
    or no transaction DAG any more: nothing says what it runs, so nothing is granted or deleted."""
    log = FakeLog({"words": {"words_etl"}})
    assert reader.pipeline_dags(log, airflow({"words_etl": set()})) == {}
    assert log.forgotten == [] and log.recorded == {"words": {"words_etl"}}


def test_a_log_the_page_may_not_write_still_grants_nothing_stale(caplog):
    log = FakeLog({"words": {"gone"}}, writable=False)
    assert reader.pipeline_dags(log, airflow({})) == {}
    assert log.forgotten == [[("words", "gone")]]
    assert "not deleted" in caplog.text


def test_no_pairing_asks_airflow_nothing():
    dags = airflow({})
    assert reader.pipeline_dags(FakeLog({}), dags) == {}
    assert dags.asked == []
