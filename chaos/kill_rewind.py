"""The rewind's chaos fault: the process running a rewind SIGKILLed at seeded points.

Each run builds a pipeline on a real Postgres (a transactional and an opaque map state) with two
real lake tables (``--sink delta``: Delta tables; ``iceberg``: Iceberg tables, catalog in the
log's Postgres), an append table and a merge table. It commits a seeded number of txids with the
old transform, begins one or two more (in flight), and rewinds to a seeded txid N in a child
process (this file with ``--child``), which stops at a seeded point and is SIGKILLed there
(its whole process group):

* a point is one step of the rewind as the child sees it: every SQL statement (``sql: ...``),
  every database commit (``commit``), and each lake table's rollback (before and after);
  the suite counts the steps of a rewind once (a throwaway run) and draws the point of each run
  from them, or past the last step (the rewind completes);
* the process dies holding the pipeline's lock, inside or between its transactions.

Then the checks, against ground truth computed in plain Python:

1. **Never a mix.** The log and every Postgres state are either exactly as before the rewind
   (last committed txid, every state's rows and bookkeeping columns, no ``txn_rewind`` row, the
   txids' statuses and attempts) or exactly rewound (as after N - 1, one ``txn_rewind`` row,
   every txid from N failed by the rewind). Each lake table is either as before or as after N - 1
   (a killed table step leaves it ahead: the next commit rolls it back), and, when the log is
   rewound, reads as after N - 1 as of the log's last committed txid.
2. **It heals.** A rewind the kill undid is run again (a user re-running the command); the txids
   from N recompute with the new transform through the normal commit. Then every state and table
   equals ground truth: the old transform before N, the new one from N. A state or table count
   above the truth is a doubled record, below it a lost one.
3. **Re-emissions** (attempts beyond a txid's first, in the table): exactly the rewind's own, one
   per txid from N; a kill, or its healing, adds none.

Usage: ``python chaos/kill_rewind.py --runs 20 --seed 2026 [--sink delta|iceberg]``. Every run
prints its seed; ``--seed <run seed> --runs 1`` replays its plan. Exits 1 if a run mixed, did
not heal, lost or doubled a record.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: chaos/ is a package of the repository
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from airflow_txn_provider.log import schema  # noqa: E402
from airflow_txn_provider.rules.history import REWOUND_BY  # noqa: E402
from airflow_txn_provider.rules.sources import TransactionalSource  # noqa: E402
from airflow_txn_provider.sinks import DeltaSink, IcebergSink, LakeSink, list_staged  # noqa: E402
from airflow_txn_provider.spark.job import LOG_URL_ENV  # noqa: E402
from airflow_txn_provider.state import MapState, load_states, stage_states  # noqa: E402
from airflow_txn_provider.transactions.commit import commit_registered  # noqa: E402
from airflow_txn_provider.transactions.transaction_log import TransactionLog  # noqa: E402
from chaos.report import FaultResult, print_table, reemissions  # noqa: E402

PIPELINE = "rw"
WORDS = [f"w{i:02d}" for i in range(30)]
STEP = 7
PAUSED = "paused"
HANG = 600.0
"""Seconds a paused child waits to be killed."""
CHILD_TIMEOUT = 120.0
SINKS = ("delta", "iceberg")


# -- the pipeline and its ground truth ----------------------------------------------------------


def records(start: int, end: int) -> list[str]:
    return [random.Random(n).choice(WORDS) for n in range(start, end)]


def old_transform(batch: list[str]) -> Counter[str]:
    return Counter(batch)


def new_transform(batch: list[str]) -> Counter[str]:
    return Counter({w.upper(): 3 * n for w, n in Counter(batch).items()})


class Ranges(TransactionalSource):
    def initialize_transaction(self, txid: int, prev_metadata: Any) -> dict[str, int]:
        start = prev_metadata["end"] if prev_metadata else 0
        return {"start": start, "end": start + STEP}


def make_sinks(kind: str, run_dir: Path, run: int) -> tuple[LakeSink, LakeSink]:
    if kind == "delta":
        return (
            DeltaSink("events", table_uri=str(run_dir / "events"), txid_column="txid"),
            DeltaSink("totals", table_uri=str(run_dir / "totals"), mode="merge", keys=["word"]),
        )
    warehouse = str(run_dir / "warehouse")
    return (
        IcebergSink("events", table=f"rw{run}.events", warehouse=warehouse, txid_column="txid"),
        IcebergSink(
            "totals", table=f"rw{run}.totals", warehouse=warehouse, mode="merge", keys=["word"]
        ),
    )


def run_txid(
    txlog: TransactionLog,
    txid: int,
    transform: Callable[[list[str]], Counter[str]],
    sinks: Sequence[LakeSink],
    *,
    commit: bool = True,
) -> tuple[int, int]:
    """Begin ``txid``, stage its counts (both states, Parquet for each table, as a job does) and
    commit it; returns its range."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    e = txlog.begin(PIPELINE, txid, Ranges())
    assert e.emitted, e
    counts = transform(records(e.metadata["start"], e.metadata["end"]))
    words = pa.table({"word": list(counts), "n": [int(v) for v in counts.values()]})
    staged = {}
    for sink in sinks:
        local = Path(sink.stage_dir(PIPELINE, txid, e.attempt, "chaos").removeprefix("file://"))
        local.mkdir(parents=True)
        batch = words
        if sink.txid_column:
            batch = batch.append_column(sink.txid_column, pa.array([txid] * len(batch)))
        pq.write_table(batch, local / "part-0.parquet")
        (local / "_SUCCESS").touch()
        staged[sink.output_key] = list_staged(str(local)).to_json()
    states = load_states(txlog.engine, PIPELINE)
    rows = list(counts.items())

    def stage(conn: Any) -> dict[str, Any]:
        return {**stage_states(conn, txid, e.attempt, {s: rows for s in states.values()}), **staged}

    txlog.stage_output(PIPELINE, txid, e.attempt, stage)
    if commit:
        assert commit_registered(txlog, PIPELINE, txid, e.attempt, sinks).applied
    return e.metadata["start"], e.metadata["end"]


def state_truth(ranges: dict[int, tuple[int, int]], transform_of: Callable[[int], Any]) -> Counter:
    total: Counter[str] = Counter()
    for t, (s, e) in ranges.items():
        total.update(transform_of(t)(records(s, e)))
    return total


def table_truth(sink: LakeSink, ranges: dict, transform_of: Callable[[int], Any]) -> Counter:
    if sink.mode == "append":
        return Counter(
            (t, w, n)
            for t, (s, e) in ranges.items()
            for w, n in transform_of(t)(records(s, e)).items()
        )
    latest: dict[str, int] = {}
    for t in sorted(ranges):
        latest.update(transform_of(t)(records(*ranges[t])))
    return Counter((w, n) for w, n in latest.items())


def table_rows(sink: LakeSink, log_url: str, as_of: int = 10**9) -> Counter:
    table = sink.open(log_url)
    try:
        rows = table.read(table.version_as_of(PIPELINE, as_of)).to_pylist()
    except Exception as err:  # no version as of the txid: an empty table
        if type(err).__name__ != "TxidNotReadableError":
            raise
        return Counter()
    if sink.mode == "merge":
        return Counter((r["word"], r["n"]) for r in rows)
    return Counter((r["txid"], r["word"], r["n"]) for r in rows)


def differences(got: Counter, want: Counter) -> tuple[int, int]:
    """(lost, doubled): counts missing from ``got``, counts there beyond ``want``."""
    keys = set(got) | set(want)
    lost = sum(max(0, want[k] - got[k]) for k in keys)
    doubled = sum(max(0, got[k] - want[k]) for k in keys)
    return lost, doubled


@dataclass(frozen=True)
class LogPicture:
    last_committed: int
    states: dict[str, list[dict[str, Any]]]
    rewinds: int
    txids: dict[int, tuple[str, int, int | None]]
    """txid -> (status, attempt, failed_by)."""


def picture(txlog: TransactionLog) -> LogPicture:
    with txlog.engine.connect() as conn:
        states = {n: s.rows(conn) for n, s in sorted(load_states(conn, PIPELINE).items())}
        rewinds = conn.execute(
            text("SELECT count(*) FROM txn_rewind WHERE pipeline = :p"), {"p": PIPELINE}
        ).scalar_one()
        txids = {
            int(t): (str(s), int(a), None if f is None else int(f))
            for t, s, a, f in conn.execute(
                text(
                    "SELECT txid, status, attempt, failed_by FROM txn_transaction "
                    "WHERE pipeline = :p"
                ),
                {"p": PIPELINE},
            )
        }
    return LogPicture(txlog.last_committed(PIPELINE), states, int(rewinds), txids)


# -- the child: a rewind that stops at a point ---------------------------------------------------


def child(args: argparse.Namespace) -> int:
    """Rewind in this process, stopping at step ``--point`` (0: never; count the steps)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    import airflow_txn_provider.sinks.delta as delta
    import airflow_txn_provider.sinks.iceberg as iceberg

    steps: list[str] = []
    paused: list[str] = []
    commits = 0

    def step(what: str) -> None:
        nonlocal commits
        if what == "commit":
            commits += 1
            what = "the log's commit" if commits == 1 else "the table step's commit"
        else:
            stage = (
                "startup"
                if not steps
                else "the log's transaction"
                if commits == 0
                else ("the table step")
            )
            what = f"{stage}: {what}"
        steps.append(what)
        if len(steps) == args.point or (args.at and what.startswith(args.at) and not paused):
            paused.append(what)
            print(json.dumps({PAUSED: len(steps), "at": what}), flush=True)
            time.sleep(HANG)

    def before_sql(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        step("sql " + " ".join(statement.split()[:3]))

    event.listen(Engine, "before_cursor_execute", before_sql)
    event.listen(Engine, "commit", lambda conn: step("commit"))
    for table_class in (delta.DeltaLakeTable, iceberg.IcebergLakeTable):
        rewind = table_class.rewind

        def stepping(self: Any, pipeline: str, txid: int, _rewind: Any = rewind) -> Any:
            step(f"before a table's rollback ({type(self).__name__})")
            version = _rewind(self, pipeline, txid)
            step(f"after a table's rollback ({type(self).__name__})")
            return version

        table_class.rewind = stepping  # type: ignore[method-assign]
    txlog = TransactionLog.from_url(os.environ[LOG_URL_ENV], migrate=False)
    result = txlog.rewind(PIPELINE, args.to, by="chaos:kill_rewind")
    print(json.dumps({"done": True, "steps": steps, "tables": dict(result.tables)}), flush=True)
    return 0


def rewind_in_child(log_url: str, to_txid: int, point: int | str, log: Path) -> dict[str, Any]:
    """Run the child; SIGKILL its process group when it pauses (at step ``point``, or at the
    first step whose name starts with it). Returns its last JSON line."""
    where = ["--at", point] if isinstance(point, str) else ["--point", str(point)]
    argv = [sys.executable, __file__, "--child", "--to", str(to_txid), *where]
    env = {**os.environ, LOG_URL_ENV: log_url}
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True
        )
        assert proc.stdout is not None
        last: dict[str, Any] = {}
        deadline = time.monotonic() + CHILD_TIMEOUT
        for line in proc.stdout:
            last = json.loads(line)
            if PAUSED in last:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            if time.monotonic() > deadline:
                break
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"the rewind child hung; see {log}") from None
    if PAUSED not in last and rc != 0:
        raise RuntimeError(f"the rewind child exited {rc}; see {log}")
    return last


# -- one run ------------------------------------------------------------------------------------


def phase(at: str | None) -> str:
    """The point's place in the rewind, for the table: its stage and what it was about to do."""
    if at is None:
        return "kill_rewind: none (it completed)"
    stage, _, what = at.partition(": ")
    kind = "sql" if what.startswith("sql") else what.split(" (")[0]
    return f"kill_rewind: {stage}" + (f", {kind}" if kind else "")


def one_run(
    seed: int,
    steps: int,
    sink_kind: str,
    admin_url: str,
    workdir: Path,
    run: int,
    at: str | None = None,
) -> FaultResult:
    """One seeded run, killed at a seeded step, or at the first step named ``at``."""
    rng = random.Random(seed)
    committed = rng.randint(4, 8)
    in_flight = rng.randint(0, 2)
    to_txid = rng.randint(1, committed + 1)
    drawn = rng.randint(1, steps + 1)  # steps + 1: past the last step, the rewind completes
    point: int | str = at if at is not None else drawn
    plan = f"txids 1..{committed} committed, {in_flight} in flight; rewind to {to_txid}"
    print(f"seed {seed}: {plan}; killed at step {point} of {steps}", flush=True)
    log_url = fresh_database(admin_url, f"kr{run}")
    run_dir = workdir / f"run{run:03d}"
    run_dir.mkdir()
    txlog = TransactionLog.from_url(log_url, migrate=False)
    try:
        return _run(
            txlog,
            log_url,
            sink_kind,
            run_dir,
            run,
            seed,
            committed,
            in_flight,
            to_txid,
            point,
            plan,
        )
    finally:
        txlog.engine.dispose()


def _run(
    txlog: TransactionLog,
    log_url: str,
    sink_kind: str,
    run_dir: Path,
    run: int,
    seed: int,
    committed: int,
    in_flight: int,
    n: int,
    point: int | str,
    plan: str,
) -> FaultResult:
    sinks = make_sinks(sink_kind, run_dir, run)
    txlog.register_pipeline(PIPELINE, source_kind="transactional", max_pending=4)
    for kind in ("transactional", "opaque"):
        MapState(PIPELINE, f"{PIPELINE}_{kind[:2]}", kind, keys={"word": "text"}).create(
            txlog.engine
        )
    ranges: dict[int, tuple[int, int]] = {}
    after: dict[int, dict[str, list[dict[str, Any]]]] = {0: picture(txlog).states}
    for txid in range(1, committed + 1):
        ranges[txid] = run_txid(txlog, txid, old_transform, sinks)
        after[txid] = picture(txlog).states
    for txid in range(committed + 1, committed + 1 + in_flight):
        run_txid(txlog, txid, old_transform, sinks, commit=False)
    last_txid = committed + in_flight
    before = picture(txlog)
    before_tables = {s.name: table_rows(s, log_url) for s in sinks}
    kept = {t: r for t, r in ranges.items() if t < n}
    rewound_tables = {s.name: table_truth(s, kept, lambda t: old_transform) for s in sinks}

    started = time.monotonic()
    out = rewind_in_child(log_url, n, point, run_dir / "child.log")
    at = out.get("at")
    now = picture(txlog)
    problems: list[str] = []
    log_old = now == before
    log_rewound = (
        now.last_committed == n - 1
        and now.rewinds == 1
        and now.states == after[n - 1]
        and all(
            now.txids[t] == ("failed", before.txids[t][1], REWOUND_BY)
            for t in range(n, last_txid + 1)
        )
        and all(now.txids[t] == before.txids[t] for t in range(1, n))
    )
    if not (log_old or log_rewound):
        problems.append(f"the log is neither as before nor rewound: last={now.last_committed}")
    for sink in sinks:
        rows = table_rows(sink, log_url)
        if log_old and rows != before_tables[sink.name]:
            problems.append(f"table {sink.name} changed while the log did not")
        if log_rewound:
            if rows not in (before_tables[sink.name], rewound_tables[sink.name]):
                problems.append(f"table {sink.name} is neither as before nor as after {n - 1}")
            if n > 1 and table_rows(sink, log_url, n - 1) != rewound_tables[sink.name]:
                problems.append(f"table {sink.name} as of txid {n - 1} is not as after it")

    # heal: run the rewind again if the kill undid it, then recompute from n with the new job
    try:
        if log_old:
            txlog.rewind(PIPELINE, n, by="chaos:kill_rewind (again)")
        for txid in range(n, last_txid + 1):
            ranges[txid] = run_txid(txlog, txid, new_transform, sinks)
    except Exception as err:  # a run that does not heal is a failed run, not a failed suite
        problems.append(f"did not heal: {type(err).__name__}: {err}")
    healed = time.monotonic() - started

    def transform_of(t: int) -> Any:
        return old_transform if t < n else new_transform

    lost = doubled = 0
    with txlog.engine.connect() as conn:
        for name, state in load_states(conn, PIPELINE).items():
            got = Counter({k[0]: v for k, v in state.items(conn).items() if v})
            l_, d_ = differences(got, state_truth(ranges, transform_of))
            lost, doubled = lost + l_, doubled + d_
            if l_ or d_:
                problems.append(f"state {name}: {l_} lost, {d_} doubled")
    for sink in sinks:
        l_, d_ = differences(table_rows(sink, log_url), table_truth(sink, ranges, transform_of))
        lost, doubled = lost + l_, doubled + d_
        if l_ or d_:
            problems.append(f"table {sink.name}: {l_} rows lost, {d_} doubled")
        if sink.open(log_url).committed_txid(PIPELINE) != last_txid:
            problems.append(f"table {sink.name} does not hold txid {last_txid}")
    # The rewind re-emits each txid from n once; a kill or its healing must add none.
    reemitted = reemissions(txlog.transactions(PIPELINE))
    if reemitted != last_txid - n + 1:
        problems.append(f"{reemitted} re-emissions, the rewind's own are {last_txid - n + 1}")
    recovered = txlog.last_committed(PIPELINE) == last_txid and not problems
    outcome = "log as before" if log_old else "log rewound" if log_rewound else "MIX"
    detail = f"{plan}; killed at {at or 'no step (completed)'}: {outcome}, re-emitted {reemitted}; "
    detail += "; ".join(problems)
    print(f"  -> {detail}", flush=True)
    return FaultResult(
        phase(at),
        seed,
        recovered,
        healed if recovered else None,
        lost,
        doubled,
        detail,
        reemitted=reemitted,
    )


def fresh_database(admin_url: str, name: str) -> str:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    engine = create_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    return url


def count_steps(sink_kind: str, admin_url: str, workdir: Path) -> list[str]:
    """The steps of one rewind (of a run's shape), from a throwaway run's child."""
    log_url = fresh_database(admin_url, "kr_count")
    run_dir = workdir / "count"
    run_dir.mkdir()
    txlog = TransactionLog.from_url(log_url, migrate=False)
    try:
        sinks = make_sinks(sink_kind, run_dir, 999)
        txlog.register_pipeline(PIPELINE, source_kind="transactional", max_pending=4)
        for kind in ("transactional", "opaque"):
            MapState(PIPELINE, f"{PIPELINE}_{kind[:2]}", kind, keys={"word": "text"}).create(
                txlog.engine
            )
        for txid in range(1, 4):
            run_txid(txlog, txid, old_transform, sinks)
        run_txid(txlog, 4, old_transform, sinks, commit=False)
    finally:
        txlog.engine.dispose()
    out = rewind_in_child(log_url, 2, 0, run_dir / "child.log")
    return list(out["steps"])


STAGES = ("the log's transaction: sql UPDATE", "the log's commit", "the table step")
"""Where the first runs of a suite are killed: inside the log's transaction (a txid's rows being
failed), at the log's commit, and in the table step after it."""


def run_suite(
    runs: int, seed: int, sink_kind: str, admin_url: str, workdir: Path
) -> list[FaultResult]:
    steps = count_steps(sink_kind, admin_url, workdir)
    print(f"a rewind has {len(steps)} steps: {steps}", flush=True)
    master = random.Random(seed)
    seeds = [seed] + [master.randrange(1, 10**6) for _ in range(runs - 1)]
    # the first runs are killed at each stage by name, so that any number of runs >= 3 kills
    # the rewind in each (a seeded step can miss the one step that is the log's commit)
    named = [*STAGES, *[None] * runs][:runs]
    return [
        one_run(s, len(steps), sink_kind, admin_url, workdir, i, at=named[i])
        for i, s in enumerate(seeds)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--sink", choices=SINKS, default="delta")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--to", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--point", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--at", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    from txn_testing.postgres import EmbeddedPostgres

    print(f"kill_rewind: --runs {args.runs} --seed {args.seed} --sink {args.sink}", flush=True)
    with tempfile.TemporaryDirectory(prefix="chaos-rewind-") as tmp, EmbeddedPostgres() as pg:
        results = run_suite(args.runs, args.seed, args.sink, pg.url, Path(tmp))
    print_table(results, title=f"kill_rewind ({args.sink}), seed {args.seed}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
