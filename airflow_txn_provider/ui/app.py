"""The FastAPI app behind the Transactions page, mounted by the plugin at ``/transactions``.

Thin on purpose: each route checks who asks, reads through :mod:`~airflow_txn_provider.ui.reader`
and renders an HTML-escaped Jinja template or returns the same payload as JSON. Who may see what
is Airflow's decision: every route depends on Airflow's ``get_user`` (a Bearer token, or the UI's
``_token`` cookie that the same-origin iframe sends), and a pipeline is shown to users who may
read a DAG that runs it now (:func:`~airflow_txn_provider.ui.reader.pipeline_dags`; with no known
DAG, only to users who may read all DAGs). Authorisation comes before the log is opened
(:class:`Reading`), so a user who may read no DAG learns nothing of the log's state. Error pages
are generic (:data:`~airflow_txn_provider.ui.errors.LOG_UNAVAILABLE`); details go to the server log.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.log.health import STALL_AFTER, Health, read_health
from airflow_txn_provider.rules.exceptions import (
    StateTxidNotReadableError,
    TxnError,
    UnknownPipelineError,
)
from airflow_txn_provider.timetables import txid_from_run_id
from airflow_txn_provider.transactions.transaction_log import TransactionLog
from airflow_txn_provider.ui import (
    MOUNT_PATH,
    actions,
    model,
    reader,
    rewind_options,
    state_reads,
)
from airflow_txn_provider.ui.access import (
    DagId,
    PipelineName,
    Reading,
    ReadingDep,
    auth_manager,
    authorized,
    require,
)
from airflow_txn_provider.ui.errors import (
    READ_FAILED,
    AccessDeniedError,
    DagAccessDeniedError,
    DagError,
    LogUnavailableError,
    StateKeyError,
    UnknownDagError,
    UnknownStateError,
)

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
POLL_MS = 2500
"""How often the page asks for fresh data."""

StallAfter = Annotated[float, Query(gt=0, le=7 * 24 * 3600)]
"""``?stall_after=`` seconds: how long a pipeline may wait without progress (default
:data:`~airflow_txn_provider.log.health.STALL_AFTER`)."""
StateName = Annotated[str, PathParam(min_length=1, max_length=250)]
ReadLimit = Annotated[int, Query(ge=1, le=state_reads.MAX_LIMIT)]
KeyValues = Annotated[list[str] | None, Query()]
"""``?key=…&key=…``: a key's column values, in the state's key column order."""

app = FastAPI(title="Transactions", docs_url=None, redoc_url=None, openapi_url=None)
app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
app.include_router(actions.router)  # what a user may change: a rewind

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["dur"] = model.format_duration
templates.filters["pretty"] = model.pretty_json
templates.filters["q"] = lambda value: quote(str(value), safe="")
templates.filters["signed"] = state_reads.signed


def _now() -> datetime:
    return datetime.now(UTC)


# -- pages -------------------------------------------------------------------------------------


def _roots(request: Request) -> tuple[str, str]:
    """URL prefix of this app (``/transactions`` once mounted) and of the Airflow UI."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    airflow_root = root[: -len(MOUNT_PATH)] if root.endswith(MOUNT_PATH) else ""
    return root, airflow_root


def _render(
    request: Request,
    template: str,
    *,
    title: str,
    status_code: int = 200,
    api: str | None = None,
    **context: Any,
) -> HTMLResponse:
    root, airflow_root = _roots(request)
    now = _now()
    html = templates.get_template(template).render(
        title=title,
        root=root,
        airflow_root=airflow_root,
        api=f"{root}{api}" if api else None,
        poll_ms=POLL_MS,
        now=model.iso(now),
        stamp=now.strftime("%H:%M:%S"),
        clock=model.clock,
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


def _pipelines(reading: Reading) -> dict[str, Any]:
    """The index's payload: empty, without opening the log, for a user who may read no DAG."""
    if reading.reads_no_dag:
        return {"pipelines": [], "now": model.iso(_now())}
    return reader.pipelines_payload(reading.txlog, reading.access, _now())


@app.get("/", response_class=HTMLResponse)
def index_page(request: Request, reading: ReadingDep) -> HTMLResponse:
    data = _pipelines(reading)
    return _render(request, "index.html", title="Transactions", api="/api/pipelines", data=data)


@app.get("/pipelines/{pipeline}", response_class=HTMLResponse)
def pipeline_page(
    request: Request,
    pipeline: PipelineName,
    reading: ReadingDep,
    user: GetUserDep,
    manager: Annotated[BaseAuthManager, Depends(auth_manager)],
) -> HTMLResponse:
    """The pipeline, with "Rewind to here" on the txids a rewind can go back to: enabled for a
    user who may edit every DAG that runs it (the rewind endpoint's own rule, which refuses the
    others anyway), disabled and saying why for the others."""
    txlog = authorized(reading, pipeline)
    data = reader.pipeline_payload(txlog, pipeline, _now())
    dag_ids = sorted(reading.pipeline_dags.get(pipeline, ()))
    rights = rewind_options.rewind_rights(
        actions.may_edit(manager, user, dag_ids), actions.NOT_AN_EDITOR
    )
    return _render(
        request,
        "pipeline.html",
        title=pipeline,
        api=f"/api/pipelines/{quote(pipeline, safe='')}",
        data=data,
        rights=rights,
    )


@app.get("/pipelines/{pipeline}/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request,
    pipeline: PipelineName,
    run_id: str,
    reading: ReadingDep,
) -> HTMLResponse:
    """A txid's attempts, by pipeline name (the txid links of the pipeline page)."""
    txlog = authorized(reading, pipeline)
    # The Airflow run link keeps assuming the DAG is named like the pipeline, as before.
    return _run(request, txlog, pipeline, run_id, dag_id=pipeline)


@app.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
def dag_run_page(
    request: Request,
    dag_id: DagId,
    run_id: str,
    reading: ReadingDep,
) -> HTMLResponse:
    """The DAG run page's "Transactions" tab (Airflow fills in ``{DAG_ID}`` and ``{RUN_ID}``):
    the run's txid in the pipeline that DAG runs. Not the pipeline named like the DAG:
    ``build_dag(pipeline, dag_id=…)`` may name the DAG otherwise."""
    if not reading.dag_access.may_read_dag(dag_id):  # before the log is opened
        raise DagAccessDeniedError(
            "you may not read this DAG, so its runs' transactions are hidden", dag_id=dag_id
        )
    txlog, access = reading.txlog, reading.access
    pipelines = model.pipelines_run_by(dag_id, reading.pipeline_dags, access, txlog.pipelines)
    if not pipelines:
        raise UnknownDagError(
            "no pipeline is recorded for this DAG yet: its begin task records the pipeline it "
            "runs, so the DAG has not begun a txid since, or it is not a transaction DAG",
            dag_id=dag_id,
        )
    if len(pipelines) > 1:  # a DAG that declares several pipelines
        return _render(
            request,
            "dag_run.html",
            title=f"{dag_id} {run_id}",
            dag_id=dag_id,
            run=run_id,
            pipelines=pipelines,
        )
    [pipeline] = pipelines
    require(access, pipeline)  # reading the DAG grants it; checked like the pipeline route anyway
    return _run(request, txlog, pipeline, run_id, dag_id=dag_id)


def _run(
    request: Request, txlog: TransactionLog, pipeline: str, run_id: str, *, dag_id: str
) -> HTMLResponse:
    """The run page of ``pipeline``'s txid named by ``run_id`` (the caller checked access);
    ``dag_id``: the DAG its Airflow run link opens."""
    txid = txid_from_run_id(run_id)
    if txid is None or txid < 1:
        txlog.last_committed(pipeline)  # a DAG that is no pipeline: 404 says so first
        return _render(
            request,
            "run.html",
            title=f"{pipeline} {run_id}",
            pipeline=pipeline,
            dag_id=dag_id,
            run=run_id,
            data=None,
        )
    data = reader.txid_payload(txlog, pipeline, txid, _now())
    return _render(
        request,
        "run.html",
        title=f"{pipeline} txid {txid}",
        api=f"/api/pipelines/{quote(pipeline, safe='')}/txids/{txid}",
        pipeline=pipeline,
        dag_id=dag_id,
        run=run_id,
        data=data,
    )


# -- JSON --------------------------------------------------------------------------------------


@app.get("/api/pipelines")
def pipelines_api(reading: ReadingDep) -> dict[str, Any]:
    return _pipelines(reading)


@app.get("/api/pipelines/{pipeline}")
def pipeline_api(pipeline: PipelineName, reading: ReadingDep) -> dict[str, Any]:
    return reader.pipeline_payload(authorized(reading, pipeline), pipeline, _now())


@app.get("/api/health")
def health_api(reading: ReadingDep, stall_after: StallAfter = STALL_AFTER) -> JSONResponse:
    """Every pipeline the user may read, judged by :mod:`airflow_txn_provider.log.health`: 200 when
    none is stalled, 503 when one is (what a load balancer or a monitor checks)."""
    names = [] if reading.reads_no_dag else reading.access.visible(reading.txlog.pipelines())
    found = [read_health(reading.txlog, name, _now(), stall_after) for name in names]
    stalled = [h.pipeline for h in found if h.status is Health.STALLED]
    body = {
        "status": (Health.STALLED if stalled else Health.OK).value,
        "stalled": stalled,
        "stall_after": stall_after,
        "pipelines": [h.to_json() for h in found],
    }
    return JSONResponse(body, status_code=503 if stalled else 200)


@app.get("/api/pipelines/{pipeline}/health")
def pipeline_health_api(
    pipeline: PipelineName, reading: ReadingDep, stall_after: StallAfter = STALL_AFTER
) -> JSONResponse:
    """One pipeline's health: 200 unless it is stalled (503)."""
    found = read_health(authorized(reading, pipeline), pipeline, _now(), stall_after)
    return JSONResponse(found.to_json(), status_code=503 if found.status is Health.STALLED else 200)


@app.get("/api/pipelines/{pipeline}/txids/{txid}")
def txid_api(
    pipeline: PipelineName,
    txid: Annotated[int, PathParam(ge=1)],
    reading: ReadingDep,
) -> dict[str, Any]:
    return reader.txid_payload(authorized(reading, pipeline), pipeline, txid, _now())


# A state's past (issue 61): a key's history, the state as of a txid (what a txid changed is in
# the txid's payload). 409 beyond retention (StateTxidNotReadableError, its message and reach).


@app.get("/api/pipelines/{pipeline}/states/{state}/history")
def state_history_api(
    pipeline: PipelineName,
    state: StateName,
    reading: ReadingDep,
    key: KeyValues = None,
    limit: ReadLimit = state_reads.HISTORY_LIMIT,
) -> dict[str, Any]:
    """Each kept txid that changed the key (``?key=`` per key column; none for a global
    state), newest first, at most ``limit``."""
    engine = authorized(reading, pipeline).engine
    return state_reads.history_payload(engine, pipeline, state, key or [], _now(), limit)


@app.get("/api/pipelines/{pipeline}/states/{state}/as_of")
def state_as_of_api(
    pipeline: PipelineName,
    state: StateName,
    txid: Annotated[int, Query(ge=0)],
    reading: ReadingDep,
    limit: ReadLimit = state_reads.AS_OF_LIMIT,
) -> dict[str, Any]:
    """The state as it stood right after ``txid``: its largest ``limit`` values, or its value."""
    engine = authorized(reading, pipeline).engine
    return state_reads.as_of_payload(engine, pipeline, state, txid, _now(), limit)


# -- errors: JSON under /api, a page elsewhere -----------------------------------------------


def _wants_json(request: Request) -> bool:
    root, _ = _roots(request)
    path = request.url.path
    relative = path[len(root) :] if root and path.startswith(root) else path
    return relative.startswith("/api/") or relative == "/api"


def _error(
    request: Request, status_code: int, message: str, err: Exception | None = None
) -> Response:
    body: dict[str, Any] = {"detail": message}
    if err is not None:
        body["error"] = type(err).__name__
    if isinstance(err, DagError):
        body["dag_id"] = err.dag_id
    elif isinstance(err, TxnError):
        body.update({"pipeline": err.pipeline, "txid": err.txid})
    if isinstance(err, StateTxidNotReadableError | UnknownStateError | StateKeyError):
        body["state"] = err.state
    if isinstance(err, StateTxidNotReadableError):  # how far back a read reaches
        body.update({k: _int(getattr(err, k)) for k in ("floor", "last_committed")})
    if _wants_json(request):
        return JSONResponse(body, status_code=status_code)
    return _render(
        request,
        "error.html",
        title=f"Error {status_code}",
        status_code=status_code,
        message=message,
        pipeline=body.get("pipeline"),
    )


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


@app.exception_handler(StateTxidNotReadableError)
def _not_readable(request: Request, err: StateTxidNotReadableError) -> Response:
    return _error(request, 409, err.detail, err)


@app.exception_handler(UnknownStateError)
def _unknown_state(request: Request, err: UnknownStateError) -> Response:
    return _error(request, 404, err.detail, err)


@app.exception_handler(StateKeyError)
def _bad_key(request: Request, err: StateKeyError) -> Response:
    return _error(request, 422, err.detail, err)


@app.exception_handler(UnknownPipelineError)
def _unknown_pipeline(request: Request, err: UnknownPipelineError) -> Response:
    message = (
        f"pipeline {err.pipeline!r} is not registered in the transaction log: its DAG, if any, "
        "has not begun a transaction yet, or it is not a transaction pipeline"
    )
    return _error(request, 404, message, err)


@app.exception_handler(AccessDeniedError)
def _access_denied(request: Request, err: AccessDeniedError) -> Response:
    return _error(request, 403, f"pipeline {err.pipeline!r}: {err.detail}", err)


@app.exception_handler(UnknownDagError)
def _unknown_dag(request: Request, err: UnknownDagError) -> Response:
    return _error(request, 404, f"DAG {err.dag_id!r}: {err.detail}", err)


@app.exception_handler(DagAccessDeniedError)
def _dag_access_denied(request: Request, err: DagAccessDeniedError) -> Response:
    return _error(request, 403, f"DAG {err.dag_id!r}: {err.detail}", err)


# The detail of a 503 or 500 (the database's host and role, the driver's words) goes to the
# server log, with its traceback (``exc_info=err``: a sync handler runs in a worker thread, outside
# the ``except`` that caught the error, where ``log.exception`` would find none); the page says
# only what failed, and for a schema of another version what to upgrade.


@app.exception_handler(LogUnavailableError)
def _log_unavailable(request: Request, err: LogUnavailableError) -> Response:
    log.error("Transactions page: %s", err, exc_info=err)
    return _error(request, 503, err.public_message, err)


@app.exception_handler(TxnError)
def _txn_error(request: Request, err: TxnError) -> Response:
    log.error("Transactions page: %s", err, exc_info=err)
    return _error(request, 500, READ_FAILED, err)


@app.exception_handler(SQLAlchemyError)
def _database_error(request: Request, err: SQLAlchemyError) -> Response:
    if isinstance(err, OperationalError | InterfaceError):
        unavailable = reader.unreachable(reader.configured_conn_id(), err)
        unavailable.__cause__ = err
        return _log_unavailable(request, unavailable)
    log.error("Transactions page: database error", exc_info=err)
    return _error(request, 500, READ_FAILED, err)


@app.exception_handler(StarletteHTTPException)
def _http_error(request: Request, err: StarletteHTTPException) -> Response:
    message = str(err.detail)
    if err.status_code in (401, 403) and not _wants_json(request):
        message += ": sign in to Airflow (this page uses the Airflow UI's session)"
    response = _error(request, err.status_code, message)
    for name, value in (err.headers or {}).items():
        response.headers[name] = value
    return response


@app.exception_handler(RequestValidationError)
def _bad_request(request: Request, err: RequestValidationError) -> Response:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in err.errors()
    )
    return _error(request, 422, f"invalid request: {problems}")
