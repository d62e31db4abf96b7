"""``make demo``: the example pipelines on a real Airflow, Spark Connect and Postgres, on loopback.

    make demo          # start (or continue) and watch txids commit; Ctrl-C stops everything
    make demo-stop     # the same stop, from another terminal

Everything lives in one folder (``var/demo`` by default): a Postgres cluster holding Airflow's
metadata database and the transaction log, ``AIRFLOW_HOME``, the Spark Connect server's logs and
the examples' data. A second ``make demo`` starts the same cluster again, so the pipelines
continue from their last committed txid (txids that were in flight are failed and replayed, in
order, by the failure sensor).

The processes started are the Postgres server, Airflow's scheduler (LocalExecutor: it runs the
tasks), dag-processor, triggerer and api-server, one Spark Connect server (``local[2]``), and a
Kafka broker on 127.0.0.1 for ``example_txn_kafka_words`` (Tansu, a real Kafka-protocol broker:
:class:`txn_testing.kafka.TansuCluster`), into whose topic ``words`` this supervisor writes
:data:`KAFKA_LINES_PER_SECOND` lines a second (:class:`KafkaFeed`). The broker keeps its log in
memory only, so a second ``make demo`` finds the topic new (another topic id) and the old
records gone: the Kafka pipeline would refuse it (``SourceLogChangedError``), as it must. The
demo then does what an operator does (docs/sources.md, "When a Kafka log is lost"): it declares
a reset at the txid after the last committed one (``$TXN_EXAMPLES_KAFKA_RESET_FROM_TXID``, read
by the example DAG), says so, and the pipeline goes on from the new log's start; what the old
log held past the last committed txid is lost with it.
Each of them has the folder in its command line or environment: that is how ``stop`` finds
exactly those (and nothing else) even if this supervisor died; ``demo.json`` names the supervisor
by pid and start time, so a reused pid is never taken for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's txn_testing (servers)
    sys.path.insert(0, str(ROOT))
MAIN_EXAMPLE = "example_txn_words"
EXAMPLES = (
    "example_txn_words",
    "example_txn_global_count",
    "example_txn_opaque_words",
    "example_txn_delta_words",
    "example_txn_iceberg_words",
    "example_txn_audited_words",
)
KAFKA_EXAMPLE = "example_txn_kafka_words"
EXAMPLES += (KAFKA_EXAMPLE,)
STATE_FILE = "demo.json"
KAFKA_TOPIC = "words"
KAFKA_LINES_PER_SECOND = 20
KAFKA_FED_FILE = "kafka-lines"
"""How many lines the demo has written to the topic (``KafkaFeed``), kept across restarts: a
restarted demo writes new lines (line ``n`` is a function of ``n``), never the old ones again."""

log = logging.getLogger("demo")


class Stop(BaseException):  # not an Exception: no `except Exception` on the way may swallow it
    """SIGTERM (``make demo-stop``), SIGINT (Ctrl-C) or SIGHUP: shut down what was started."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise Stop(signal.Signals(signum).name)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with its pid, it names one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # field 22 of stat; "Z": a zombie is gone


def _is_supervisor(state: dict[str, Any]) -> bool:
    """Whether the supervisor ``state`` recorded still runs (not another process that reuses
    its pid after a crash or a reboot)."""
    pid = int(state.get("pid", 0))
    return pid > 0 and _start_time(pid) is not None and _start_time(pid) == state.get("started")


def demo_processes(home: Path) -> list[int]:
    """Live processes of the demo in ``home``: each has the folder in its command line or its
    environment (AIRFLOW_HOME, the Postgres data folder, the Spark work folder, …). Only these
    are ever signalled, however the supervisor ended."""
    marker = str(home).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if (marker in cmdline or marker in environ) and _start_time(int(entry.name)):
            found.append(int(entry.name))
    return found


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _read_state(home: Path) -> dict[str, Any] | None:
    path = home / STATE_FILE
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except ValueError:
        return None


def _write_state(home: Path, state: dict[str, Any]) -> None:
    tmp = home / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(home / STATE_FILE)


def _ensure_databases(admin_url: str, names: Sequence[str]) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        have = set(conn.execute(text("SELECT datname FROM pg_database")).scalars())
        for name in names:
            if name not in have:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


class KafkaFeed(threading.Thread):
    """Writes :data:`KAFKA_LINES_PER_SECOND` lines a second to the demo's topic, line ``n`` to
    partition ``n % 4`` with the timestamp :data:`EPOCH_MS` + ``n``; a restarted demo goes on
    from the line after the last one written (:meth:`resume`, :data:`KAFKA_FED_FILE`)."""

    EPOCH_MS = 1_767_225_600_000
    """2026-01-01T00:00Z: line ``n``'s timestamp is this plus ``n`` milliseconds."""

    WORDS = ("storm", "spark", "airflow", "batch", "commit", "txid", "kafka", "offset", "state")

    def __init__(self, cluster: Any, home: Path) -> None:
        super().__init__(name="kafka-feed", daemon=True)
        self.cluster, self.count_file = cluster, home / KAFKA_FED_FILE
        self.done = threading.Event()
        self.written = 0

    @classmethod
    def line(cls, n: int) -> str:
        rng = random.Random(n)
        return " ".join(rng.choice(cls.WORDS) for _ in range(6))

    def write(self, start: int, stop: int) -> None:
        from txn_testing.kafka import PARTITIONS

        for partition in range(PARTITIONS):
            numbers = [n for n in range(start, stop) if n % PARTITIONS == partition]
            if numbers:
                self.cluster.produce(
                    KAFKA_TOPIC,
                    [self.line(n) for n in numbers],
                    partition=partition,
                    timestamps=[self.EPOCH_MS + n for n in numbers],
                )
        self.count_file.write_text(str(stop))

    def resume(self) -> None:
        """Go on from the line after the last one an earlier run wrote."""
        self.written = int(self.count_file.read_text()) if self.count_file.exists() else 0

    def run(self) -> None:
        try:
            while not self.done.wait(1.0):
                self.write(self.written, self.written + KAFKA_LINES_PER_SECOND)
                self.written += KAFKA_LINES_PER_SECOND
        except Exception:
            log.exception("the demo's Kafka feed stopped")


def up(args: argparse.Namespace) -> int:
    from airflow_txn_provider.rules.exceptions import UnknownPipelineError
    from airflow_txn_provider.transactions.transaction_log import TransactionLog
    from txn_testing.airflow import (
        ADMIN_USER,
        AirflowStack,
        txn_log_connection_env,
    )
    from txn_testing.kafka import TansuCluster
    from txn_testing.postgres import EmbeddedPostgres
    from txn_testing.spark import SparkConnectServer

    home: Path = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    previous = _read_state(home)
    if previous and _is_supervisor(previous):
        print(
            f"the demo in {home} is already running (pid {previous['pid']}): make demo-stop first",
            file=sys.stderr,
        )
        return 1
    stop_leftovers(home)  # of a supervisor that died without cleaning up
    for what, port, flag in (
        ("Airflow", args.port, "DEMO_PORT=… make demo"),
        ("Postgres", args.pg_port, "--pg-port"),
    ):
        if port is not None and _port_in_use(port):
            print(
                f"port {port} (for {what}) is in use on 127.0.0.1: free it or choose another "
                f"({flag})",
                file=sys.stderr,
            )
            return 1
    state = {"pid": os.getpid(), "started": _start_time(os.getpid()), "home": str(home)}
    _write_state(home, state)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)

    pg = EmbeddedPostgres(datadir=home / "pg", port=args.pg_port)
    spark = SparkConnectServer(port=args.spark_port, workdir=home / "spark", master="local[2]")
    os.environ["TXN_DEMO_HOME"] = str(home)  # the Kafka broker's mark (demo_processes)
    kafka = TansuCluster(log_file=home / "kafka.log")
    feed: KafkaFeed | None = None
    stack: AirflowStack | None = None
    try:
        print(f"[demo] starting Postgres in {home / 'pg'} …", flush=True)
        pg.start()
        _ensure_databases(pg.url, ["airflow", "txn"])
        base = pg.url.rsplit("/", 1)[0]
        txn_url = f"{base}/txn"
        # In-flight txids of a previous run: fail them now so their sensors replay them in order.
        txlog = TransactionLog.from_url(txn_url)
        for pipeline in EXAMPLES:
            with contextlib.suppress(UnknownPipelineError):  # not registered before its txid 1
                txlog.recover(pipeline)

        print("[demo] starting the Spark Connect server (local[2]) …", flush=True)
        spark.start()
        print(
            "[demo] starting a Kafka broker on 127.0.0.1 (Tansu, its log in memory) …", flush=True
        )
        kafka.start()
        reset = kafka_reset(txlog)
        if reset is not None:
            print(
                f"[demo] the Kafka broker restarted empty: {KAFKA_EXAMPLE} would refuse its new "
                f"topic {KAFKA_TOPIC!r} (SourceLogChangedError); the demo declares "
                f"reset_log_from_txid={reset}, as an operator would (docs/sources.md, 'When a "
                "Kafka log is lost'): it goes on from the new log's start",
                flush=True,
            )
        feed = KafkaFeed(kafka, home)
        feed.resume()
        feed.start()

        data = home / "data"
        env = {
            **txn_log_connection_env("txn_log_default", txn_url),
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": spark.url,
            "TXN_EXAMPLES_DATA": str(data),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka.config}),
            "TXN_EXAMPLES_KAFKA_TOPIC": KAFKA_TOPIC,
            **({"TXN_EXAMPLES_KAFKA_RESET_FROM_TXID": str(reset)} if reset is not None else {}),
        }
        stack = AirflowStack(
            home / "airflow",
            f"{base}/airflow",
            ROOT / "dags",
            env=env,
            port=args.port,
            password=args.password,
        )
        print(
            "[demo] starting Airflow (scheduler, dag-processor, triggerer, api-server) …",
            flush=True,
        )
        stack.start()
        client = stack.client()
        for dag_id in EXAMPLES:
            client.wait_for_dag(dag_id)
        unpaused = args.unpause or [MAIN_EXAMPLE]
        for dag_id in unpaused:
            client.unpause(dag_id)
        print(
            "\n"
            f"  Airflow UI     {stack.url}   (login {ADMIN_USER} / {args.password})\n"
            f"  Transactions   {stack.url}/transactions/\n"
            f"  Grid           {stack.url}/dags/{MAIN_EXAMPLE}\n"
            f"  Spark UI       {spark.ui_url}\n"
            f"  Kafka          {kafka.bootstrap_servers}   (Tansu, a real Kafka-protocol broker; "
            f"topic {KAFKA_TOPIC}, {KAFKA_LINES_PER_SECOND} lines/s)\n"
            f"  Data, logs     {home}\n\n"
            f"  Unpaused: {', '.join(unpaused)}; unpause the other examples in the UI.\n"
            "  Ctrl-C or `make demo-stop` stops every process the demo started.\n",
            flush=True,
        )
        watch_commits(txlog, stack, args.exit_after)
        return 0
    except Stop as why:
        print(f"\n[demo] {why}: stopping …", flush=True)
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        if stack is not None:
            stack.stop()
        if feed is not None:
            feed.done.set()
            feed.join(10)
        kafka.stop()
        spark.stop()
        pg.stop()
        (home / STATE_FILE).unlink(missing_ok=True)
        print("[demo] stopped", flush=True)


def kafka_reset(txlog: Any) -> int | None:
    """The txid from which the Kafka example starts again on the demo's new broker log: the one
    after its last committed txid, if an earlier run began any (``None``: a first run)."""
    from airflow_txn_provider.rules.exceptions import UnknownPipelineError

    try:
        view = txlog.view(KAFKA_EXAMPLE)
    except UnknownPipelineError:
        return None
    if view.last_committed == 0 and not view.in_flight:
        return None
    return view.last_committed + 1


def watch_commits(txlog: Any, stack: Any, exit_after: int | None) -> None:
    """Print each commit of the examples as it lands; return after ``exit_after`` commits."""
    seen: dict[str, int] = {}
    printed = 0
    while True:
        stack._check_alive()
        for pipeline in EXAMPLES:
            try:
                txids = txlog.transactions(pipeline, since_txid=seen.get(pipeline, 0))
            except Exception:  # not registered until its first txid begins
                continue
            for tx in txids:
                if tx.status.value != "committed":
                    break
                took = ""
                if tx.begun_at and tx.committed_at:
                    took = f" in {(tx.committed_at - tx.begun_at).total_seconds():.1f} s"
                print(
                    f"[demo] {pipeline} txid {tx.txid} committed (attempt {tx.attempt}){took} "
                    f"{json.dumps(tx.metadata)}",
                    flush=True,
                )
                seen[pipeline] = tx.txid
                printed += 1
        if exit_after is not None and printed >= exit_after:
            return
        time.sleep(2)


def stop_leftovers(home: Path) -> None:
    """End what a demo left running in ``home``: its processes (found by the folder, see
    :func:`demo_processes`), Postgres through ``pg_ctl`` first so it shuts down cleanly."""
    for pid in demo_processes(home):
        if b"postgres" not in _cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(
        b"postgres" not in _cmdline(pid) for pid in demo_processes(home)
    ):
        time.sleep(0.5)
    if (home / "pg" / "postmaster.pid").exists():
        from txn_testing.postgres import EmbeddedPostgres

        EmbeddedPostgres(datadir=home / "pg").stop()
    for pid in demo_processes(home):
        log.warning("killing pid %s: %s", pid, _cmdline(pid)[:200].decode(errors="replace"))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (home / STATE_FILE).unlink(missing_ok=True)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def stop(args: argparse.Namespace) -> int:
    home: Path = args.home.resolve()
    state = _read_state(home)
    if state is None and not demo_processes(home):
        print(f"no demo running in {home}")
        return 0
    if state is not None and _is_supervisor(state):
        pid = int(state["pid"])
        print(f"[demo] stopping the demo (pid {pid}) …", flush=True)
        os.kill(pid, signal.SIGTERM)  # it stops what it started, then exits
        deadline = time.monotonic() + args.timeout
        while _is_supervisor(state) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _is_supervisor(state):
            print(f"[demo] pid {pid} did not stop in {args.timeout:.0f} s: killing it", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    stop_leftovers(home)  # whatever a supervisor that died or was killed left behind
    print("[demo] stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", nargs="?", choices=["up", "stop"], default="up")
    parser.add_argument("--home", type=Path, default=ROOT / "var" / "demo")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8080")))
    parser.add_argument("--pg-port", type=int, default=54331)
    parser.add_argument("--spark-port", type=int, default=None)
    parser.add_argument("--password", default="admin")
    parser.add_argument(
        "--unpause",
        action="append",
        choices=EXAMPLES,
        help=f"up: unpause this example (repeatable; default {MAIN_EXAMPLE})",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="stop: wait this long")
    parser.add_argument(
        "--exit-after", type=int, default=None, help="stop after this many commits (tests)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "airflow_txn_provider"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command == "stop":
        return stop(args)
    return up(args)


if __name__ == "__main__":
    sys.exit(main())
