"""Reads the transaction log and the state tables for the Transactions page.

The log is opened through :class:`~airflow_txn_provider.hooks.txn_log.TxnLogHook` on the Airflow
connection named by ``[txn_provider] ui_txn_log_conn_id`` (default ``txn_log_default``), lazily on
the first request and then kept (one engine per connection id): the plugin module connects to
nothing when Airflow imports it. ``migrate=False``: a page never changes the schema.

Each ``*_payload`` function reads what one page needs and shapes it with
:mod:`airflow_txn_provider.ui.model`; the same dict is rendered as HTML and served as JSON.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from airflow_txn_provider.hooks.txn_log import TxnLogHook
from airflow_txn_provider.log.expectations import (
    attempt_outcomes,
    quarantined,
    quarantined_counts_of,
)
from airflow_txn_provider.log.health import health_from_log
from airflow_txn_provider.log.outputs import read_completeness
from airflow_txn_provider.operators.txn import PIPELINE_FIELD
from airflow_txn_provider.rules.exceptions import (
    SchemaTooNewError,
    SchemaTooOldError,
    TxnError,
    UnknownPipelineError,
)
from airflow_txn_provider.rules.vocabulary import TxStatus
from airflow_txn_provider.state import GlobalState, load_states, quote_ident
from airflow_txn_provider.timetables import txid_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog, engine_from_url
from airflow_txn_provider.ui import model, rewind_options, state_reads
from airflow_txn_provider.ui.audit import (
    QUARANTINE_SAMPLE,
    audit_summary,
    expectation_trends,
    with_audit,
)
from airflow_txn_provider.ui.errors import LogUnavailableError
from airflow_txn_provider.utils.redaction import redact

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from airflow_txn_provider.log.expectations import QuarantinedRow
    from airflow_txn_provider.log.reads import AttemptInfo
    from airflow_txn_provider.rules.records import PipelineView
    from airflow_txn_provider.state import MapState
    from airflow_txn_provider.transactions.retention import RetentionInfo

log = logging.getLogger(__name__)

CONFIG_SECTION = "txn_provider"
CONFIG_KEY = "ui_txn_log_conn_id"
DEFAULT_CONN_ID = "txn_log_default"
CONNECT_TIMEOUT_S = 5
"""A database that does not answer fails the request after this long, instead of hanging it."""
PAGE_OUTAGE_TIMEOUT = 3.0
"""Seconds a page waits for a restarting log database (the log's default is minutes, right for a
task, not for a page): long enough to replace a pooled connection a restart dropped, short enough
that the page answers 503 at once while the database is down (its script retries by itself)."""


def configured_conn_id() -> str:
    """The Airflow connection the page reads: ``[txn_provider] ui_txn_log_conn_id``."""
    from airflow.configuration import conf

    return str(conf.get(CONFIG_SECTION, CONFIG_KEY, fallback=DEFAULT_CONN_ID))


def unreachable(conn_id: str, err: Exception) -> LogUnavailableError:
    """The database behind the connection did not answer: say which and what to check."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return LogUnavailableError(
        f"the transaction log database of Airflow connection {conn_id!r} cannot be reached "
        f"({type(err).__name__}: {detail}). Check that Postgres is up and that the connection "
        f"points to it, or set [{CONFIG_SECTION}] {CONFIG_KEY} to the right connection id."
    )


class LogProvider:
    """Opens the configured transaction log once and keeps it (thread-safe).

    A failure is not kept: the next request tries again, so the page recovers by itself once the
    connection is created or the database is back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, TransactionLog] = {}

    def get(self) -> TransactionLog:
        conn_id = configured_conn_id()
        with self._lock:
            found = self._logs.get(conn_id)
            if found is None:
                found = self._logs[conn_id] = self._open(conn_id)
        return found

    @staticmethod
    def _open(conn_id: str) -> TransactionLog:
        hook = TxnLogHook(conn_id)
        try:
            url = hook.log_url()
        except TxnError as err:  # the hook's message says how to create the connection
            raise LogUnavailableError(
                f"{err.detail}. The Transactions page reads connection {conn_id!r}; set "
                f"[{CONFIG_SECTION}] {CONFIG_KEY} (AIRFLOW__{CONFIG_SECTION.upper()}__"
                f"{CONFIG_KEY.upper()}) to use another one."
            ) from err
        engine = engine_from_url(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
        try:
            return TransactionLog(engine, migrate=False, outage_timeout=PAGE_OUTAGE_TIMEOUT)
        except (SchemaTooOldError, SchemaTooNewError) as err:  # what to upgrade: nothing secret
            engine.dispose()
            message = f"connection {conn_id!r}: {err.detail}"
            raise LogUnavailableError(message, advice=err.detail) from err
        except TxnError as err:
            engine.dispose()
            raise LogUnavailableError(f"connection {conn_id!r}: {err.detail}") from err
        except SQLAlchemyError as err:
            engine.dispose()
            raise unreachable(conn_id, err) from err

    def reset(self) -> None:
        """Forget (and close) every opened log: tests, or after changing the connection."""
        with self._lock:
            for opened in self._logs.values():
                opened.engine.dispose()
            self._logs.clear()


# -- who runs which pipeline ------------------------------------------------------------------

DagPipelines = Callable[[Collection[str]], Mapping[str, frozenset[str]]]
"""DAG ids -> the pipelines each of those DAGs runs now; a DAG that does not exist is left out
(:func:`airflow_dag_pipelines`: Airflow's serialized DAGs)."""


def pipeline_dags(txlog: TransactionLog, dag_pipelines: DagPipelines) -> dict[str, frozenset[str]]:
    """Pipeline -> ids of the DAGs that run it now: the one rule of which DAG grants a pipeline.

    A pipeline's claiming task records its DAG in the log (``txn_pipeline_dag``, the pairing):
    that is what ties a DAG to a pipeline, whatever the DAG's id (``build_dag(pipeline,
    dag_id=…)``). A pairing (pipeline P, DAG D) counts only while Airflow still has DAG D and D,
    as it is now, runs P (``dag_pipelines``: its tasks declare P, see :data:`~airflow_txn_provider.
    operators.txn.PIPELINE_FIELD`). So a deleted DAG grants nothing, and a DAG id reused for
    another pipeline grants that pipeline, not the old one, from the moment Airflow has the new
    DAG. Those pairings are then deleted from the log (best effort: a log the page may not write
    to keeps them, and they still count for nothing); a DAG that comes back running P records its
    pairing again at its next claim. A pairing whose DAG exists but declares no pipeline (a DAG
    serialized by a version before the declaration, or no transaction DAG any more) counts for
    nothing either, and is kept. A log that records no pairing maps nothing: then only users who
    may read every DAG see pipelines, rather than anyone who may read a DAG named like one.
    """
    recorded = txlog.pipeline_dags()
    dag_ids = {dag_id for ids in recorded.values() for dag_id in ids}
    now = dag_pipelines(dag_ids) if dag_ids else {}
    current: dict[str, set[str]] = {}
    gone: list[tuple[str, str]] = []
    for pipeline, ids in recorded.items():
        for dag_id in ids:
            runs = now.get(dag_id)
            if runs is not None and pipeline in runs:
                current.setdefault(pipeline, set()).add(dag_id)
            elif runs is None or runs:  # deleted, or running other pipelines now
                gone.append((pipeline, dag_id))
    if gone:
        _forget(txlog, gone)
    return {pipeline: frozenset(ids) for pipeline, ids in current.items()}


def _forget(txlog: TransactionLog, pairs: list[tuple[str, str]]) -> None:
    try:
        txlog.forget_pipeline_dags(pairs)
    except SQLAlchemyError as err:  # e.g. a read-only role: the pairings still count for nothing
        log.warning("Transactions page: stale DAG pairings %s not deleted: %s", pairs, err)
    else:
        log.info("Transactions page: deleted pairings of DAGs gone or reused: %s", pairs)


_DECLARED: dict[tuple[str, str], frozenset[str]] = {}
"""(serialized DAG's id, its hash) -> the pipelines it declares: deserialized once per version."""


def airflow_dag_pipelines(dag_ids: Collection[str]) -> dict[str, frozenset[str]]:
    """The pipelines each of ``dag_ids`` runs now, as Airflow's metadata database has the DAG:
    its latest serialized version, whose tasks carry their pipeline's name (the operators'
    :data:`~airflow_txn_provider.operators.txn.PIPELINE_FIELD`, a template field Airflow keeps).
    A DAG Airflow does not have (deleted, or never parsed) is left out."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    found: dict[str, frozenset[str]] = {}
    with create_session() as session:
        rows = SerializedDagModel.get_latest_serialized_dags(
            dag_ids=sorted(dag_ids), session=session
        )
        for row in rows:
            key = (str(row.id), str(row.dag_hash))
            declared = _DECLARED.get(key)
            if declared is None:
                names = (getattr(task, PIPELINE_FIELD, None) for task in row.dag.tasks)
                declared = frozenset(name for name in names if isinstance(name, str) and name)
                if len(_DECLARED) > 10_000:
                    _DECLARED.clear()
                _DECLARED[key] = declared
            found[row.dag_id] = declared
    return found


# -- payloads ----------------------------------------------------------------------------------


def pipelines_payload(
    txlog: TransactionLog, access: model.DagAccess, now: datetime
) -> dict[str, Any]:
    """The index: every pipeline the user may read, with its counts and lag."""
    rows = []
    for name in access.visible(txlog.pipelines()):
        try:
            view = txlog.view(name)
            rows.append({**model.pipeline_summary(view), "health": _health(txlog, view, now)})
        except UnknownPipelineError:
            continue  # deleted since it was listed
        except TxnError as err:  # a corrupt log of one pipeline must not hide the others
            log.warning("Transactions page: pipeline %s cannot be read: %s", name, err)
            rows.append(model.broken_pipeline(name, str(err)))
    return {"pipelines": rows, "now": model.iso(now)}


def pipeline_payload(
    txlog: TransactionLog, pipeline: str, now: datetime, limit: int = model.TXID_LIMIT
) -> dict[str, Any]:
    """One pipeline: summary, newest ``limit`` txids (each with its current attempt's audit and
    what a rewind to it recomputes), chart series, committed states, its outputs and from which
    txid each is complete, each expectation's trend, retention and how far back a rewind
    reaches."""
    view = txlog.view(pipeline)  # UnknownPipelineError: a 404
    summary = model.pipeline_summary(view)
    since = model.window_since(summary["newest_txid"], limit)
    txs = txlog.transactions(pipeline, since_txid=since, limit=limit)
    retention = txlog.retention(pipeline)
    floor = retention.rewind_floor
    with txlog.engine.connect() as conn:
        outputs = read_completeness(conn, pipeline)
        audited = attempt_outcomes(conn, pipeline, since_txid=since)  # an index range: bounded
    done = {(t.txid, t.attempt) for t in txs if t.status is TxStatus.COMMITTED}
    committed = [(txid, found) for txid, attempt, found in audited if (txid, attempt) in done]
    rows = with_audit(model.txid_rows(txs, now), audited)
    # A fill from history changes its state between commits: its progress is part of the version
    filled = tuple((o["name"], o["fill"]["filled_through"]) for o in outputs if o["filling"])
    version = (summary["last_committed"], filled) if filled else summary["last_committed"]
    states = state_summaries(txlog.engine, pipeline, version)
    return {
        "pipeline": {**summary, "health": _health(txlog, view, now)},
        "limit": limit,
        "txids": rewind_options.with_rewind_options(rows, view, floor),
        "chart": model.chart_series(txs, now),
        "states": model.with_completeness(states, outputs),
        "outputs": outputs,
        "expectations": {
            "committed_txids": len(committed),
            "trends": expectation_trends(committed, audited),
        },
        "retention": _retention(retention),
        "rewind": rewind_options.rewind_reach(view, floor),
        "now": model.iso(now),
    }


def _health(txlog: TransactionLog, view: PipelineView, now: datetime) -> dict[str, Any]:
    """The health endpoint's verdict at its default ``stall_after``, with its reason."""
    with txlog.engine.connect() as conn:
        found = health_from_log(conn, view, now)
    return {"status": found.status.value, "reason": found.reason}


def _retention(r: RetentionInfo) -> dict[str, Any]:
    return model.retention_summary(
        r.keep_txids,
        r.pruned_txids,
        r.pruned_attempts,
        r.pruned_failed_attempts,
        r.pruned_through_txid,
    )


def txid_payload(txlog: TransactionLog, pipeline: str, txid: int, now: datetime) -> dict[str, Any]:
    """One txid: its current record, every attempt, its audit (:func:`txid_audit`) and what it
    changed in each state (:func:`.state_reads.txid_changes_payload`). A txid whose run exists
    but that has not begun yet (no data, or waiting for its turn) has no record: ``current`` is
    ``None``; so has a txid whose record retention pruned (``pruned``: committed long ago)."""
    last_committed = txlog.last_committed(pipeline)  # UnknownPipelineError: a 404
    current = txlog.transaction(pipeline, txid)
    attempts = txlog.attempts(pipeline, txid) if current is not None else []
    pruned = current is None and txid <= txlog.retention(pipeline).pruned_through_txid
    with txlog.engine.connect() as conn:
        rows = quarantined(conn, pipeline, txid=txid, limit=QUARANTINE_SAMPLE)
        counts = quarantined_counts_of(conn, pipeline, txid)
    audited = [(a.txid, a.attempt, list(a.expectations)) for a in attempts if a.expectations]
    done = (current.attempt, current.committed_at) if current is not None else None
    return {
        "pipeline": pipeline,
        "txid": txid,
        "run_id": txid_run_id(txid),
        "last_committed": last_committed,
        "current": with_audit([model.txid_row(current, now)], audited)[0] if current else None,
        "pruned": pruned,
        "attempts": model.attempt_rows(attempts, now),
        "audit": txid_audit(attempts, rows, counts),
        "changes": state_reads.txid_changes_payload(
            txlog.engine, pipeline, txid, last_committed, done
        ),
        "now": model.iso(now),
    }


# -- states ------------------------------------------------------------------------------------


_SUMMARY_CACHE: dict[tuple[str, str], tuple[Hashable, list[dict[str, Any]]]] = {}
TOP_KEYS_EXACT_UP_TO = 100_000
TOP_KEYS_REFRESH_S = 30.0
"""A map state's top keys are a scan of its table (a value index would slow every commit): up to
``TOP_KEYS_EXACT_UP_TO`` keys (tens of ms) they are read again after each commit, above it at most
every ``TOP_KEYS_REFRESH_S`` seconds, however often commits come. Count and sum are exact at
every commit."""
_TOP_CACHE: dict[tuple[str, str], tuple[float, list[tuple[Any, ...]]]] = {}


def state_summaries(
    engine: Engine, pipeline: str, last_committed: Hashable | None = None
) -> list[dict[str, Any]]:
    """The committed value of every state of ``pipeline``; a state that cannot be read says why.

    A map state may hold millions of keys, and the page asks every few seconds: its key count and
    sum are those each commit keeps up to date (one row), and its top keys, a scan of the table,
    are read at most every ``TOP_KEYS_REFRESH_S`` seconds once it is large. Only a commit changes
    a state, so with ``last_committed`` given the summaries are read once per commit, not once per
    request (and once per step of a fill from history: the caller passes its progress too).
    """
    key = (engine.url.render_as_string(hide_password=True), pipeline)
    cached = _SUMMARY_CACHE.get(key)
    if last_committed is not None and cached is not None and cached[0] == last_committed:
        return cached[1]
    summaries = _read_state_summaries(engine, pipeline)
    if last_committed is not None and not any("error" in s for s in summaries):
        _SUMMARY_CACHE[key] = (last_committed, summaries)
    return summaries


def _read_state_summaries(engine: Engine, pipeline: str) -> list[dict[str, Any]]:
    summaries = []
    url = engine.url.render_as_string(hide_password=True)
    for state in load_states(engine, pipeline).values():
        try:
            with engine.connect() as conn:
                summaries.append(_state_summary(conn, state, url))
        except (OperationalError, InterfaceError):
            raise  # the database, not this state's table: a 503, which names nothing of it
        except SQLAlchemyError as err:
            detail = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            summaries.append(model.state_error(state.name, detail))
    return summaries


def _state_summary(conn: Any, state: MapState, url: str = "") -> dict[str, Any]:
    """One state's numbers: the key count and sum each commit keeps (:meth:`MapState.summary`,
    one row) and the top keys (see ``TOP_KEYS_EXACT_UP_TO``). A state no commit summarised
    yet (created by an earlier version) is counted once, in SQL."""
    kind = str(state.kind)
    if isinstance(state, GlobalState):
        return model.global_state_summary(state.name, kind, state.value(conn))
    found = state.summary(conn)
    if found is None:
        table = quote_ident(state.table)
        found = conn.execute(text(f"SELECT count(*), sum(value) FROM {table}")).one()
    n, total = found
    key, now = (url, state.table), time.monotonic()
    cached = _TOP_CACHE.get(key)
    if n > TOP_KEYS_EXACT_UP_TO and cached is not None and now - cached[0] < TOP_KEYS_REFRESH_S:
        top = cached[1]
    else:
        top = state.top(conn, model.TOP_KEYS)
        _TOP_CACHE[key] = (now, top)
    return model.map_state_summary(state.name, kind, list(state.keys), n, total, top)


def txid_audit(
    attempts: Sequence[AttemptInfo], rows: Sequence[QuarantinedRow], counts: Mapping[str, int]
) -> dict[str, Any]:
    """A txid's audit panel: the outcomes of its newest attempt that recorded any (``attempt``
    ``None``: none did, no expectation is declared or none was judged yet) and its quarantined
    rows (``quarantined``: how many, ``quarantined_by_output``, ``quarantine``: a sample). A
    message may quote the database's error: redacted like every error shown."""
    newest = max((a for a in attempts if a.expectations), key=lambda a: a.attempt, default=None)
    outcomes = list(newest.expectations) if newest is not None else []
    return {
        "attempt": newest.attempt if newest is not None else None,
        "summary": audit_summary(outcomes),
        "outcomes": [{**o, "message": redact(str(o.get("message") or ""))} for o in outcomes],
        "quarantined": sum(counts.values()),
        "quarantined_by_output": dict(sorted(counts.items())),
        "quarantine": [
            {
                "output": r.output,
                "attempt": r.attempt,
                "expectations": list(r.expectations),
                "row": r.row,
                "row_json": model.compact_json(r.row, 400),
                "quarantined_at": model.iso(r.quarantined_at),
            }
            for r in rows
        ],
    }
