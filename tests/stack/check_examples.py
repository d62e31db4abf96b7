"""Ground truth of the example pipelines, checked inside a container of the stack.

Run by tests/stack/run.py as ``podman exec -i <airflow worker> python - < this file``: it needs
what an Airflow worker has (the provider, the DAG files, the log's connection, /data) and nothing
of the test's. It reads each pipeline's committed txids from the log, recomputes in plain Python
what the outputs must hold from their committed metadata, compares, and prints one JSON object:
``{pipeline: {"committed": N, "checks": {name: "ok" | reason}}}``.

What is recomputed, by source: the landing examples (opaque, Iceberg) re-derive every line of
every committed file (``landing_lines``), so their word counts are exact per word; the generated
examples (words, global count, Delta) know each line's word count but not its words (a Spark
hash picks them), so their checks are per txid and in total: lines x words per line, the ranges
tiling with no gap or overlap, and the derived state equal to the counts bucketed afresh. The
Kafka example's records are the ones the stack test's feed wrote and logged on /data.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

DAGS = Path("/opt/txn/dags")
sys.path.insert(0, str(DAGS))

from airflow_txn_provider.hooks.txn_log import TxnLogHook  # noqa: E402
from airflow_txn_provider.state import load_states  # noqa: E402

PIPELINES = sys.argv[1:] or [
    "example_txn_words",
    "example_txn_global_count",
    "example_txn_opaque_words",
    "example_txn_delta_words",
    "example_txn_iceberg_words",
    "example_txn_kafka_words",
]
KAFKA_FEED = Path("/data/txn_examples/kafka-feed.jsonl")
"""Every record the stack test's feed wrote and the broker acknowledged (tests/stack/kafka.py)."""


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, DAGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lines_of(metadata_list) -> int:
    return sum(end - start for m in metadata_list for start, end in m.values())


def landing_words(metadata_list) -> Counter:
    from txn_examples import landing_lines

    return Counter(
        w
        for m in metadata_list
        for partition, (start, end) in m.items()
        for seq in range(start, end)
        for line in landing_lines(partition, seq)
        for w in json.loads(line)["line"].split()
    )


def committed_snapshot(txlog, name: str):
    """The committed txids and the states, read so that no commit falls between the two."""
    for _ in range(20):
        before = txlog.last_committed(name)
        with txlog.engine.connect() as conn:
            states = {n: s.items(conn) for n, s in load_states(conn, name).items()}
        txids = [t for t in txlog.transactions(name) if t.txid <= before]
        if txlog.last_committed(name) == before:
            return txids, states
    raise RuntimeError(f"{name}: commits kept landing while its states were read")


def check(txlog, name: str) -> dict:
    module = load(name)
    checks: dict[str, str] = {}
    txids, states = committed_snapshot(txlog, name)

    def expect(label: str, ok: bool, why: str = "") -> None:
        checks[label] = "ok" if ok else (why or "mismatch")

    numbers = [t.txid for t in txids]
    expect(
        "txids 1..N all committed, in order",
        numbers == list(range(1, len(numbers) + 1))
        and all(t.status.value == "committed" for t in txids),
        f"{numbers}",
    )
    stamps = [t.committed_at for t in txids]
    expect("commit times follow txid order", stamps == sorted(stamps), f"{stamps}")
    metadata = [t.metadata for t in txids]
    # opaque batches need not tile; the Kafka example's tile per log (kafka_checks)
    if name not in ("example_txn_opaque_words", "example_txn_kafka_words"):
        gaps = [
            (b.txid, a.metadata, b.metadata)
            for a, b in itertools.pairwise(txids)
            if {p: r[0] for p, r in b.metadata.items()} != {p: r[1] for p, r in a.metadata.items()}
        ]
        expect("batches tile the source (no gap, no overlap)", not gaps, f"{gaps[:2]}")

    if name in ("example_txn_words", "example_txn_delta_words"):
        wpl = module.txn_pipeline.source.words_per_line
        if name == "example_txn_words":
            counts = {k[0]: v for k, v in states[f"{name}_counts"].items()}
            expect(
                "word counts sum to words per line x committed lines",
                sum(counts.values()) == wpl * lines_of(metadata),
                f"{sum(counts.values())} != {wpl * lines_of(metadata)}",
            )
            buckets = {k[0]: v for k, v in states[f"{name}_buckets"].items() if v}
            expect(
                "bucket state = the counts bucketed afresh",
                buckets == dict(Counter(c // 10 for c in counts.values())),
            )
        else:
            import pyarrow.compute as pc

            sink = module.SINK
            table = sink.open()
            last = numbers[-1] if numbers else 0
            expect(
                "table's committed txid >= the log's (later commits go on meanwhile)",
                table.committed_txid(name) >= last,
                f"{table.committed_txid(name)} < {last}",
            )
            rows = table.read(table.version_as_of(name, last)) if last else None
            bad = []
            for t in txids:
                mine = rows.filter(pc.equal(rows["txid"], t.txid)).to_pylist()
                if sum(r["delta"] for r in mine) != wpl * lines_of([t.metadata]) or len(
                    {r["word"] for r in mine}
                ) != len(mine):
                    bad.append(t.txid)
            expect("each txid's rows: its batch's words, each word once", not bad, f"txids {bad}")
            versions = dict(table.versions(name))
            differ = [
                (
                    t.txid,
                    (t.output or {}).get(sink.output_key, {}).get("commit"),
                    versions.get(t.txid),
                )
                for t in txids
                if (t.output or {}).get(sink.output_key, {}).get("commit", {}).get("version")
                != versions.get(t.txid)
            ]
            expect(
                "one table version per txid, the one the log recorded", not differ, f"{differ[:3]}"
            )
    elif name == "example_txn_global_count":
        total = states[f"{name}_total"]
        expect(
            "total = committed lines",
            total == {(True,): lines_of(metadata)},
            f"{total} != {lines_of(metadata)}",
        )
    elif name == "example_txn_opaque_words":
        counts = {k[0]: v for k, v in states[f"{name}_counts"].items()}
        truth = dict(landing_words(metadata))
        lost = sum(max(truth.get(w, 0) - counts.get(w, 0), 0) for w in truth | counts)
        doubled = sum(max(counts.get(w, 0) - truth.get(w, 0), 0) for w in truth | counts)
        expect(
            "word counts = the committed files' words, exactly",
            counts == truth,
            f"{lost} lost, {doubled} doubled",
        )
    elif name == "example_txn_iceberg_words":
        expected: dict[str, tuple[int, int]] = {}
        for t in txids:  # the newest txid a word appeared in, and its count there
            for word, n in landing_words([t.metadata]).items():
                expected[word] = (t.txid, n)
        table = module.SINK.open(txlog.engine.url.render_as_string(hide_password=False))
        last = numbers[-1] if numbers else 0
        expect(
            "table's committed txid >= the log's (later commits go on meanwhile)",
            table.committed_txid(name) >= last,
            f"{table.committed_txid(name)} < {last}",
        )
        rows = table.read(table.version_as_of(name, last)).to_pylist() if last else []
        got = {r["word"]: (r["txid"], r["delta"]) for r in rows}
        expect(
            "each word's newest count and txid, exactly",
            got == expected and len(rows) == len(expected),
            f"{len(rows)} rows, {len(expected)} expected",
        )
    elif name == "example_txn_kafka_words":
        kafka_checks(txids, states[f"{name}_counts"], expect)
    return {"committed": len(numbers), "checks": checks}


def kafka_checks(txids, state, expect) -> None:
    """The committed offsets, per log (topic id), tile each partition from offset 0 once, each
    is a record the feed wrote, and the counts are those records' words, exactly."""
    from airflow_txn_provider.sources.kafka import offset_ranges

    fed = {}
    for line in KAFKA_FEED.read_text().splitlines():
        r = json.loads(line)
        fed[(r["topic_id"], f"words-{r['partition']}", r["offset"])] = r["line"]
    truth: Counter = Counter()
    ends: dict[tuple[str, str], int] = {}
    unknown, untiled = [], []
    for t in txids:
        log_id = (t.metadata.get("log") or {}).get("topic_id")
        for partition, (start, end) in offset_ranges(t.metadata).items():
            if start != ends.get((log_id, partition), 0):
                untiled.append((t.txid, partition, start, ends.get((log_id, partition), 0)))
            ends[(log_id, partition)] = end
            for offset in range(start, end):
                line = fed.get((log_id, partition, offset))
                if line is None:
                    unknown.append((t.txid, partition, offset))
                else:
                    truth.update(line.split())
    expect("each log's partitions tiled from offset 0, once", not untiled, f"{untiled[:3]}")
    expect("every committed offset is a record the feed wrote", not unknown, f"{unknown[:3]}")
    counts = {k[0]: v for k, v in state.items()}
    lost = sum(max(truth.get(w, 0) - counts.get(w, 0), 0) for w in truth | counts)
    doubled = sum(max(counts.get(w, 0) - truth.get(w, 0), 0) for w in truth | counts)
    expect(
        f"word counts = the committed records' words, exactly ({len({k[0] for k in ends})} logs)",
        counts == dict(truth),
        f"{lost} lost, {doubled} doubled",
    )


def main() -> None:
    txlog = TxnLogHook().get_log(migrate=False)
    try:
        result = {name: check(txlog, name) for name in PIPELINES}
    finally:
        txlog.engine.dispose()
    print(json.dumps(result))


main()
