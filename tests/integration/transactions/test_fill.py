"""Outputs added to a running pipeline and filled from history (issue 44), on a real Postgres log
and a real Spark (the session's local JVM).

Pipeline ``fp`` counts words through txids 1..5 (job v1). Txid 6 begins, then the declaration
adds three outputs with ``start="history"``: an opaque state (line lengths), a non-transactional
one (first letters) and a Delta table (every word, stamped with its txid). Txid 6, begun before
the declaration but processed after it by job v2, stages them too, and commits without them;
txid 7 begins after it (``live_from``), is processed and commits without them (they fill); txid
8 is processed and waits. The fill computes txids 1..6 with its own jobs, in chunks, applies
txid 7 from the rows its live processing staged, and joins; txid 8's commit and later ones apply
the new outputs with the old one. Ground truth: pipeline ``gt``, every output declared with the
pipeline, job v2 from txid 1 over the same batches. Every table must equal it row for row,
bookkeeping columns included, and the Delta table as of every txid.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from pyspark.sql import functions as F
from sqlalchemy import text

from airflow_txn_provider.log.outputs import read_completeness, read_outputs
from airflow_txn_provider.rules.exceptions import FillRefusedError
from airflow_txn_provider.rules.filling import FillProgress
from airflow_txn_provider.rules.names import quote_ident
from airflow_txn_provider.rules.sources import OpaqueSource
from airflow_txn_provider.sinks import DeltaSink
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from airflow_txn_provider.spark.fill import fill_pipeline
from airflow_txn_provider.spark.job import BatchJob, process_batch
from airflow_txn_provider.state import MapState
from airflow_txn_provider.transactions.commit import commit_registered
from tests.spark_data import parquet_dataset, random_lines

pytestmark = pytest.mark.integration

WORD = r"[^\p{L}\p{N}']+"


def outputs(p: str, lake_root) -> tuple[list[MapState], list[DeltaSink]]:
    """``p``'s outputs: the word counts it started with, and the three added later."""
    states = [
        MapState(p, f"{p}_counts", "transactional", keys={"word": "text"}),
        MapState(p, f"{p}_lengths", "opaque", keys={"n": "bigint"}),
        MapState(p, f"{p}_firsts", "non_transactional", keys={"letter": "text"}),
    ]
    return states, [DeltaSink(f"{p}_words", table_uri=str(lake_root / p))]


def v1(p: str):
    def transform(batch):
        words = batch.select(F.explode(F.split(F.lower("line"), WORD)).alias("word"))
        return {
            f"{p}_counts": words.where("word != ''")
            .groupBy("word")
            .count()
            .withColumnRenamed("count", "delta")
        }

    return transform


def v2(p: str):
    def transform(batch):
        words = batch.select(F.explode(F.split(F.lower("line"), WORD)).alias("word")).where(
            "word != ''"
        )
        return {
            f"{p}_counts": words.groupBy("word").agg(F.count("*").alias("delta")),
            f"{p}_lengths": batch.groupBy(F.length("line").cast("long").alias("n")).agg(
                F.count("*").alias("delta")
            ),
            f"{p}_firsts": words.groupBy(F.substring("word", 1, 1).alias("letter")).agg(
                F.count("*").alias("delta")
            ),
            f"{p}_words": words.select("word"),
        }

    return transform


def v2_only(p: str, *outputs: str):
    """``v2`` returning only ``p``'s ``outputs`` (by their names without the ``p_`` prefix)."""
    both, keep = v2(p), {f"{p}_{name}" for name in outputs}
    return lambda batch: {k: v for k, v in both(batch).items() if k in keep}


def begin(txlog, p, source):
    e = txlog.begin_next(p, source)
    assert e is not None and e.emitted, e
    return e


def process(spark, txlog, p, source, e, transform, sinks):
    process_batch(
        spark, txlog, BatchJob(p, e.txid, e.attempt, source, sinks=tuple(sinks)), transform
    )


def commit(txlog, p, e, sinks):
    assert commit_registered(txlog, p, e.txid, e.attempt, sinks).applied


def table_rows(txlog, state: MapState) -> list[tuple]:
    """Every row of the state's table, bookkeeping columns included, in key order."""
    with txlog.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT * FROM {quote_ident(state.table)} ORDER BY 1")).all()
    return [tuple(r) for r in rows]


def lake_rows(sink: DeltaSink, p: str, txid: int, db_url: str) -> list[tuple]:
    table = sink.read_as_of(p, txid, log_url=db_url)
    return sorted(tuple(r.values()) for r in table.to_pylist())


@pytest.fixture
def source(tmp_path):
    data = {str(i): random_lines(44 + i, 144) for i in range(2)}  # 12 txids of 12 lines each
    return PartitionedParquetSource(str(parquet_dataset(tmp_path / "ds", data)), 12)


def declare(txlog, p, states, sinks, **kw):
    txlog.ensure_pipeline(
        p, source_kind="transactional", max_pending=4, states=states, sinks=sinks, **kw
    )


def test_outputs_added_later_are_filled_exactly_while_the_pipeline_commits(
    txlog, db_url, spark, source, tmp_path
):
    p = "fp"
    states, sinks = outputs(p, tmp_path / "lake")
    declare(txlog, p, states[:1], [])
    for _ in range(5):
        e = begin(txlog, p, source)
        process(spark, txlog, p, source, e, v1(p), [])
        commit(txlog, p, e, [])
    in_flight = begin(txlog, p, source)  # txid 6: begun before the declaration

    added = {s.name: "history" for s in [*states[1:], *sinks]}
    declare(txlog, p, states, sinks, start=added)
    with txlog.engine.connect() as conn:
        recorded = read_outputs(conn, p)
        shown = {o["name"]: o for o in read_completeness(conn, p)}
    assert recorded[f"{p}_lengths"].fill == FillProgress(f"{p}_lengths", 7, 0, 0, None)
    assert shown[f"{p}_words"]["complete"].startswith("filling: 0 % of history")
    assert shown[f"{p}_counts"]["complete"] == "complete from txid 1"

    # txid 6 processed after the declaration (its rows for the new outputs staged, never
    # applied: its fill computes it), txid 7 after it too; both commit without the new outputs
    process(spark, txlog, p, source, in_flight, v2(p), sinks)
    commit(txlog, p, in_flight, sinks)
    seventh = begin(txlog, p, source)
    assert seventh.txid == 7
    process(spark, txlog, p, source, seventh, v2(p), sinks)
    commit(txlog, p, seventh, sinks)
    assert table_rows(txlog, states[1]) == [] and table_rows(txlog, states[2]) == []
    eighth = begin(txlog, p, source)
    process(spark, txlog, p, source, eighth, v2(p), sinks)  # waits, processed

    lines: list[str] = []
    report = fill_pipeline(
        txlog,
        p,
        spark=spark,
        source=source,
        transforms=[v2(p)],
        sinks=sinks,
        chunk=4,
        on_progress=lines.append,
    )
    print("\n".join(lines))
    names = sorted(added)
    assert report.joined_after == dict.fromkeys(names, 7), report
    assert report.computed == dict.fromkeys(names, 6), report
    assert report.applied_staged == dict.fromkeys(names, 1), report
    commit(txlog, p, eighth, sinks)
    for _ in range(2):
        e = begin(txlog, p, source)
        process(spark, txlog, p, source, e, v2(p), sinks)
        commit(txlog, p, e, sinks)
    with txlog.engine.connect() as conn:
        shown = {o["name"]: o for o in read_completeness(conn, p)}
    assert shown[f"{p}_lengths"]["complete"] == (
        "complete from txid 1 (filled from history, joined the live commits after txid 7)"
    )
    assert not shown[f"{p}_words"]["partial"]

    # the ground truth: every output from txid 1
    gt = "gt"
    truth_states, truth_sinks = outputs(gt, tmp_path / "lake")
    declare(txlog, gt, truth_states, truth_sinks)
    for _ in range(10):
        e = begin(txlog, gt, source)
        process(spark, txlog, gt, source, e, v2(gt), truth_sinks)
        commit(txlog, gt, e, truth_sinks)
    assert txlog.last_committed(p) == txlog.last_committed(gt) == 10
    for mine, truth in zip(states, truth_states, strict=True):
        assert table_rows(txlog, mine) == table_rows(txlog, truth), mine.name
        assert table_rows(txlog, mine), mine.name
        with txlog.engine.connect() as conn:  # the page's figures, kept by every apply
            values = mine.items(conn).values()
            assert mine.summary(conn) == (len(values), sum(values)), mine.name
    for txid in range(1, 11):
        assert lake_rows(sinks[0], p, txid, db_url) == lake_rows(
            truth_sinks[0], gt, txid, db_url
        ), txid


class Steps(OpaqueSource):
    def initialize_transaction(self, txid, prev):
        return {"txid": txid}


def _committed(txlog, p, source, txids):
    """Begin and commit ``txids`` new txids that stage nothing (no outputs yet)."""
    for _ in range(txids):
        e = begin(txlog, p, source)
        txlog.stage_output(p, e.txid, e.attempt, lambda conn: {})
        assert commit_registered(txlog, p, e.txid, e.attempt).applied


def test_a_fill_is_refused_where_history_cannot_be_replayed_exactly(txlog):
    """An opaque source may read other records on a replay: refused, nothing recorded."""
    p = "fr"
    later = MapState(p, f"{p}_later", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline(p, source_kind="opaque", max_pending=2)
    _committed(txlog, p, Steps(), 1)
    with pytest.raises(FillRefusedError, match="its source is opaque") as refused:
        txlog.ensure_pipeline(
            p, source_kind="opaque", max_pending=2, states=[later], start={later.name: "history"}
        )
    assert refused.value.pipeline == p and refused.value.output == later.name
    with txlog.engine.connect() as conn:
        assert later.name not in read_outputs(conn, p)
    # a source that declares exact replays of committed ranges (OpaqueKafkaSource does) may
    assert txlog.ensure_pipeline(
        p,
        source_kind="opaque",
        max_pending=2,
        states=[later],
        start={later.name: "history"},
        replays_exactly=True,
    )


def test_a_fill_is_refused_once_retention_pruned_history_and_named_how_far_back(txlog, source):
    p = "fk"
    later = MapState(p, f"{p}_later", "transactional", keys={"word": "text"})
    txlog.ensure_pipeline(p, source_kind="transactional", max_pending=2, keep_txids=2)
    _committed(txlog, p, source, 5)
    assert txlog.prune(p) == 3
    with pytest.raises(FillRefusedError, match=r"pruned txids 1..3 .* back to txid 4 only"):
        txlog.ensure_pipeline(
            p,
            source_kind="transactional",
            max_pending=2,
            keep_txids=2,
            states=[later],
            start={later.name: "history"},
        )


def _live(txlog, spark, p, source, sinks, until, stop, errors):
    """The live pipeline, in a thread: begin (a re-queued txid first), process, commit, one txid
    at a time, until ``until`` committed; a txid a rewind failed meanwhile just replays."""
    from airflow_txn_provider.rules.exceptions import TxnError

    try:
        while not stop.is_set() and txlog.last_committed(p) < until:
            e = txlog.begin_next(p, source)
            if e is None or not e.emitted:
                continue
            try:
                process(spark, txlog, p, source, e, v2(p), sinks)
                commit_registered(txlog, p, e.txid, e.attempt, sinks)
            except TxnError as err:  # a rewind failed it under us: replayed next
                print("live:", err)
    except BaseException as err:  # the test fails on it
        errors.append(err)


def _truth(txlog, spark, source, tmp_path, txids, lake):
    gt = "gt"
    truth_states, truth_sinks = outputs(gt, tmp_path / "lake")
    truth_sinks = [_lake(lake, gt, tmp_path)]
    declare(txlog, gt, truth_states, truth_sinks)
    for _ in range(txids):
        e = begin(txlog, gt, source)
        process(spark, txlog, gt, source, e, v2(gt), truth_sinks)
        commit(txlog, gt, e, truth_sinks)
    return gt, truth_states, truth_sinks


def _lake(kind, p, tmp_path):
    from airflow_txn_provider.sinks import IcebergSink

    if kind == "delta":
        return DeltaSink(f"{p}_words", table_uri=str(tmp_path / "lake" / p))
    return IcebergSink(f"{p}_words", table=f"lake.{p}_words", warehouse=str(tmp_path / "wh"))


def _same_as_truth(txlog, db_url, p, states, sinks, truth, last):
    gt, truth_states, truth_sinks = truth
    for mine, other in zip(states, truth_states, strict=True):
        assert table_rows(txlog, mine) == table_rows(txlog, other), mine.name
    for txid in range(1, last + 1):
        mine_rows = lake_rows(sinks[0], p, txid, db_url)
        assert mine_rows == lake_rows(truth_sinks[0], gt, txid, db_url), txid


@pytest.mark.parametrize("lake", ["delta", "iceberg"])
def test_a_rewind_during_the_fill_while_the_pipeline_commits_ends_exact(
    lake, txlog, db_url, spark, source, tmp_path
):
    """The live pipeline commits in a thread while the fill runs; after the fill's first chunk
    the pipeline is rewound to txid 2 (below what the fill applied): the rewind takes the
    filling outputs back with the others (their undo records, the lake table), the fill resumes
    from txid 1 on, and everything ends equal to the ground truth."""
    import threading

    p = "fw"
    states, _ = outputs(p, tmp_path / "lake")
    sinks = [_lake(lake, p, tmp_path)]
    declare(txlog, p, states[:1], [])
    for _ in range(4):
        e = begin(txlog, p, source)
        process(spark, txlog, p, source, e, v1(p), [])
        commit(txlog, p, e, [])
    declare(txlog, p, states, sinks, start={s.name: "history" for s in [*states[1:], *sinks]})

    stop, errors = threading.Event(), []
    live = threading.Thread(
        target=_live, args=(txlog, spark, p, source, sinks, 10, stop, errors), daemon=True
    )
    live.start()
    rewound = []

    def rewind_once(line):
        print(line)
        if "computed" in line and not rewound:
            rewound.append(txlog.rewind(p, 2, by="test", reason="a rewind during the fill"))

    try:
        report = fill_pipeline(
            txlog,
            p,
            spark=spark,
            source=source,
            transforms=[v2(p)],
            sinks=sinks,
            chunk=2,
            wait=0.2,
            on_progress=rewind_once,
        )
    finally:
        live.join(timeout=300)
        stop.set()
    assert not errors, errors
    assert rewound and rewound[0].to_txid == 2
    assert txlog.last_committed(p) >= 10
    joined = report.joined_after
    assert set(joined) == {"fw_lengths", "fw_firsts", "fw_words"}, report
    # txids 1..2, then 2..4 again after the rewind (txid 5 on: staged by the live processing)
    assert report.computed == dict.fromkeys(joined, 5), report
    # the live commits after the join apply them with the rest: bring it to 12, then compare
    for _ in range(12 - txlog.last_committed(p)):
        e = begin(txlog, p, source)
        process(spark, txlog, p, source, e, v2(p), sinks)
        commit(txlog, p, e, sinks)
    truth = _truth(txlog, spark, source, tmp_path, 12, lake)
    _same_as_truth(txlog, db_url, p, states, sinks, truth, 12)


def test_retention_keeps_what_the_fill_needs_and_prunes_after_the_join(
    txlog, spark, source, tmp_path
):
    p = "fk2"
    states, _ = outputs(p, tmp_path / "lake")
    declare(txlog, p, states[:1], [])
    for _ in range(6):
        e = begin(txlog, p, source)
        process(spark, txlog, p, source, e, v1(p), [])
        commit(txlog, p, e, [])
    # the history outputs and a short retention in one declaration: nothing is pruned yet
    txlog.ensure_pipeline(
        p,
        source_kind="transactional",
        max_pending=4,
        states=states[:2],
        keep_txids=1,
        start={states[1].name: "history"},
    )
    pruned_while_filling = []

    def prune_now(line):
        print(line)
        if "computed" in line:
            before = txlog.retention(p).pruned_through_txid
            txlog.prune(p)
            after = txlog.retention(p).pruned_through_txid
            with txlog.engine.connect() as conn:
                through = read_outputs(conn, p)[states[1].name].filled_through
            pruned_while_filling.append((before, after, through))
            assert after <= through  # never a txid the fill still needs

    names = {s.name for s in states[:2]}

    def counts_and_lengths(batch):
        return {k: v for k, v in v2(p)(batch).items() if k in names}

    report = fill_pipeline(
        txlog,
        p,
        spark=spark,
        source=source,
        transforms=[counts_and_lengths],
        chunk=2,
        on_progress=prune_now,
    )
    assert report.joined_after == {states[1].name: 6}
    assert [t for _, _, t in pruned_while_filling] == [2, 4, 6]
    assert [a for _, a, _ in pruned_while_filling] == [2, 4, 5]  # keep_txids=1 keeps txid 6
    assert txlog.prune(p) == 0 and txlog.retention(p).pruned_through_txid == 5


def test_a_fill_audits_each_txid_as_its_live_commit_would(txlog, spark, source, tmp_path):
    """An output added with ``start="history"`` and expectations on it: the fill drops, warns
    and quarantines exactly as commits that had it from txid 1 did; a failed ``fail`` one stops
    the fill at its txid, naming it, and the output holds nothing past the txid before it."""
    from airflow_txn_provider import ExpectationsFailedError, RowCondition, RowCount
    from airflow_txn_provider.log.expectations import quarantined

    def rules(p):
        on = f"{p}_lengths"
        return [
            RowCondition(on=on, condition="n % 3 <> 0", action="drop", name="not thirds"),
            RowCondition(on=on, condition="delta < 3", name="rare lengths"),
        ]

    def v3(p):  # the counts and the lengths
        return v2_only(p, "counts", "lengths")

    def run(p, added, txids=5):
        states, _ = outputs(p, tmp_path / "lake")
        declare(txlog, p, states[:1] if added else states[:2], [])
        for _ in range(txids):
            e = begin(txlog, p, source)
            process(spark, txlog, p, source, e, v3(p) if not added else v1(p), [])
            exp = [] if added else rules(p)
            assert commit_registered(txlog, p, e.txid, e.attempt, [], exp).applied
        return states

    filled = run("fa", added=True)
    declare(txlog, "fa", filled[:2], [], start={"fa_lengths": "history"})
    report = fill_pipeline(
        txlog, "fa", spark=spark, source=source, transforms=[v3("fa")], expectations=rules("fa")
    )
    assert report.joined_after == {"fa_lengths": 5}
    truth = run("ga", added=False)
    assert table_rows(txlog, filled[1]) == table_rows(txlog, truth[1])
    with txlog.engine.connect() as conn:
        mine = sorted(
            (q.txid, q.expectations, tuple(q.row.items())) for q in quarantined(conn, "fa")
        )
        theirs = sorted(
            (q.txid, q.expectations, tuple(q.row.items())) for q in quarantined(conn, "ga")
        )
    assert mine == theirs and mine
    for txid in range(1, 6):
        got = {
            o["expectation"]: {**o, "on": 0} for o in txlog.attempts("fa", txid)[-1].expectations
        }
        want = {
            o["expectation"]: {**o, "on": 0} for o in txlog.attempts("ga", txid)[-1].expectations
        }
        assert got == want, txid

    # a fail expectation that txid 1 fails stops the fill there
    stopped = run("fs", added=True)
    declare(txlog, "fs", stopped[:2], [], start={"fs_lengths": "history"})
    strict = [RowCount(on="fs_lengths", max=0, action="fail", name="none")]  # every txid fails
    with pytest.raises(ExpectationsFailedError, match=r"txid=1 .*'none' on fs_lengths"):
        fill_pipeline(
            txlog, "fs", spark=spark, source=source, transforms=[v3("fs")], expectations=strict
        )
    assert table_rows(txlog, stopped[1]) == []


def test_a_fill_audits_a_lake_sink_and_gives_its_transform_the_input_its_live_one_got(
    txlog, db_url, spark, source, tmp_path
):
    """A Delta table added with ``start="history"`` and a drop on it, in a pipeline that drops
    input lines: the fill gives each txid's transform the lines its live commit kept, writes the
    words that meet the table's rule and quarantines the others, as commits that had the table
    from txid 1 did; warned and dropped outcomes recorded alike."""
    from airflow_txn_provider import Check, RowCondition
    from airflow_txn_provider.log.expectations import quarantined
    from airflow_txn_provider.spark.audit import for_job

    def rules(p):
        return [
            RowCondition(condition="length(line) % 5 <> 0", action="drop", name="fifths"),
            RowCondition(on=f"{p}_words", condition="length(word) > 3", action="drop", name="long"),
            RowCondition(on=f"{p}_words", condition="word <> 'the'", name="no the"),
            Check(on=f"{p}_words", fn=lambda rows: (len(rows) < 40, f"{len(rows)}"), name="few"),
        ]

    def v4(p):  # the counts and the words
        return v2_only(p, "counts", "words")

    def run(p, added, txids=4):
        states, sinks = outputs(p, tmp_path / "lake")
        live = [] if added else sinks
        declare(txlog, p, states[:1], live)
        exp = [e for e in rules(p) if e.on == "input" or not added]
        for _ in range(txids):
            e = begin(txlog, p, source)
            job = BatchJob(p, e.txid, e.attempt, source, sinks=tuple(live))
            job = replace(job, expectations=for_job(exp, live))
            process_batch(spark, txlog, job, v1(p) if added else v4(p))
            assert commit_registered(txlog, p, e.txid, e.attempt, live, exp).applied
        return states, sinks

    states, sinks = run("fl", added=True)
    declare(txlog, "fl", states[:1], sinks, start={"fl_words": "history"})
    report = fill_pipeline(
        txlog,
        "fl",
        spark=spark,
        source=source,
        transforms=[v4("fl")],
        sinks=sinks,
        expectations=rules("fl"),
    )
    assert report.joined_after == {"fl_words": 4}
    truth_states, truth_sinks = run("gl", added=False)
    assert table_rows(txlog, states[0]) == table_rows(txlog, truth_states[0])
    for txid in range(1, 5):
        mine, theirs = (
            lake_rows(sinks[0], "fl", txid, db_url),
            lake_rows(truth_sinks[0], "gl", txid, db_url),
        )
        assert mine == theirs and mine, txid
    with txlog.engine.connect() as conn:
        found = {
            p: sorted(
                (q.txid, q.output.replace(p, ""), q.expectations, tuple(q.row.items()))
                for q in quarantined(conn, p, limit=10**6)
            )
            for p in ("fl", "gl")
        }
    assert found["fl"] == found["gl"]
    assert {(t, o) for t, o, *_ in found["fl"]} == {
        (t, o) for t in range(1, 5) for o in ("input", "_words")
    }
    for txid in range(1, 5):
        got = {
            o["expectation"]: {**o, "on": 0} for o in txlog.attempts("fl", txid)[-1].expectations
        }
        want = {
            o["expectation"]: {**o, "on": 0} for o in txlog.attempts("gl", txid)[-1].expectations
        }
        assert got == want and got["long"]["taken"] == "dropped", txid
        assert got["few"]["rows_checked"] == len(lake_rows(sinks[0], "fl", txid, db_url)) - len(
            lake_rows(sinks[0], "fl", txid - 1, db_url) if txid > 1 else []
        )
