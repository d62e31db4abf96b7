"""Airflow hook: Airflow's own REST API (``/api/v2``), used to restart a txid's run.

Tasks cannot touch Airflow's database (Airflow 3), so the failure sensor restarts runs the way the
UI does: ``POST /api/v2/dags/{dag_id}/clearTaskInstances`` with a JWT from ``POST /auth/token``;
retention deletes the runs of old txids with ``DELETE /api/v2/dags/{dag_id}/dagRuns/{run_id}``.
Credentials come from an Airflow connection and never appear in a log line or an error.
While the api-server is away a request is sent again with :meth:`AirflowApiHook.backoff`'s waits
(a :class:`~airflow_txn_provider.utils.retries.Backoff`).
"""

from __future__ import annotations

import itertools
import os
import ssl
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from airflow.sdk import BaseHook

from airflow_txn_provider.compat.airflow import CLEAR_TAKES_NOTE, trigger_run_from_task
from airflow_txn_provider.compat.python import UTC
from airflow_txn_provider.rules.exceptions import RequeueError
from airflow_txn_provider.timetables import txid_from_run_id, txid_logical_date, txid_run_id
from airflow_txn_provider.utils.retries import Backoff

RETRY_STATUS = frozenset({500, 502, 503, 504})
"""Answers of an api-server that is restarting or overloaded: asked again, not reported."""
UNPROCESSED_STATUS = frozenset({502, 503})
"""Answers that say the request was not processed (no server behind a proxy, or not ready): the
only ones, with a connection never made, after which a POST is sent again. A POST that may have
been processed (a timeout, a 500) is reported: clearing runs twice would kill the tasks the first
clear started."""
KEEPALIVE_EXPIRY = 2.0
"""Seconds an idle connection to the api-server is kept for the next call: under uvicorn's 5 s
(``timeout_keep_alive``), so the client never sends on a connection the server is closing."""

_ssl_context: ssl.SSLContext | None = None
_clients: dict[float, httpx.Client] = {}
_tokens: dict[str, str] = {}
_shared_lock = threading.Lock()


def _forget_parent_clients() -> None:
    """In a forked child (a task process): its own clients and tokens, never its parent's
    sockets, and a lock no parent thread holds."""
    global _shared_lock
    _clients.clear()
    _tokens.clear()
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_clients)


def shared_ssl_context() -> ssl.SSLContext:
    """httpx's default SSL context (certifi's CAs), built once and kept across forks: loading the
    CAs is most of a client's start, and the preload builds it in the process that forks the
    tasks (``airflow_txn_provider.preload``), so a task process builds none."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def shared_client(timeout: float) -> httpx.Client:
    """The process's HTTP client for calls with ``timeout``: one connection pool (the next call
    reuses the open connection), on :func:`shared_ssl_context` (httpx would build a context,
    and load its CAs, per client)."""
    with _shared_lock:
        client = _clients.get(timeout)
        if client is None:
            limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)
            client = _clients[timeout] = httpx.Client(
                timeout=timeout, limits=limits, verify=shared_ssl_context()
            )
        return client


class AirflowApiHook(BaseHook):
    """Calls the Airflow REST API of the deployment the task runs in.

    The connection (type ``airflow_api``) holds host, port, *schema* (``http`` or ``https``) and a
    user's login and password. Without a login the hook asks for a token with no credentials,
    which only an api-server with ``simple_auth_manager_all_admins`` grants (local use).

    :param airflow_api_conn_id: the Airflow connection id (default ``airflow_api_default``).
    :param timeout: seconds per HTTP request.
    :param outage_timeout: seconds a request is retried, with backoff, while the api-server cannot
        be reached or answers 5xx (a restart); then the last error is raised. A POST (a clear) is
        sent again only if it surely was not processed (no connection, 502, 503).
    """

    conn_name_attr = "airflow_api_conn_id"
    default_conn_name = "airflow_api_default"
    conn_type = "airflow_api"
    hook_name = "Airflow REST API"

    def __init__(
        self,
        airflow_api_conn_id: str = default_conn_name,
        *,
        timeout: float = 30.0,
        outage_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.airflow_api_conn_id = airflow_api_conn_id
        self.timeout = timeout
        self.outage_timeout = outage_timeout
        self._token: str | None = _tokens.get(airflow_api_conn_id)
        self._base_url: str | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["extra"],
            "relabeling": {"schema": "Scheme", "login": "Username"},
            "placeholders": {"host": "127.0.0.1", "port": "8080", "schema": "http"},
        }

    def backoff(self) -> Backoff:
        """Waits between sends: 1 s doubling to 10 s, each 50-100 % of that, for
        ``outage_timeout`` seconds from the first send."""
        return Backoff(first=1.0, cap=10.0, deadline=self.outage_timeout, floor=0.5)

    def base_url(self) -> str:
        """The api-server's address, from the connection (read once per hook)."""
        if self._base_url is None:
            self._base_url = self._connection_base_url()
        return self._base_url

    def _connection_base_url(self) -> str:
        conn = self.get_connection(self.airflow_api_conn_id)
        if not conn.host:
            raise RequeueError(
                f"Airflow connection {self.airflow_api_conn_id!r} has no host: set it to the "
                "api-server's address (e.g. 127.0.0.1, port 8080)"
            )
        host = conn.host.rstrip("/")
        if "://" not in host:
            host = f"{conn.schema or 'http'}://{host}"
        return f"{host}:{conn.port}" if conn.port else host

    # -- calls -------------------------------------------------------------------------------------

    def clear_task_instances(
        self,
        dag_id: str,
        task_ids: Sequence[str],
        *,
        run_id: str | None = None,
        logical_dates: tuple[datetime, datetime] | None = None,
        note: str | None = None,
        reset_dag_runs: bool = False,
    ) -> list[str]:
        """Clear ``task_ids`` (whatever their state) of one run, or of every run whose logical
        date lies in ``logical_dates`` (both ends included), in one request: the scheduler runs
        them again and kills those still running. The runs stay running, so they keep their
        ``max_active_runs`` slots; ``reset_dag_runs`` also puts finished runs back in the queue
        (a rewind's committed txids). ``note`` goes on each task instance cleared, from Airflow
        3.3 (before it the call takes none: the caller's own log says why it cleared). Returns
        ``run_id: task_id`` of each task instance cleared."""
        if (run_id is None) == (logical_dates is None):
            raise ValueError("give exactly one of run_id and logical_dates")
        body: dict[str, Any] = {
            "dry_run": False,
            "task_ids": list(task_ids),
            "only_failed": False,
            "reset_dag_runs": reset_dag_runs,
        }
        if run_id is not None:
            body["dag_run_id"] = run_id
        else:
            assert logical_dates is not None
            body["start_date"], body["end_date"] = (d.isoformat() for d in logical_dates)
        if note and CLEAR_TAKES_NOTE:
            body["note"] = note[:1000]
        found = self.request("POST", f"/api/v2/dags/{quote(dag_id)}/clearTaskInstances", json=body)
        cleared = found.get("task_instances", [])
        return sorted({f"{ti['dag_run_id']}: {ti['task_id']}" for ti in cleared})

    def create_txid_run(self, dag_id: str, txid: int) -> bool:
        """Create the DAG run of ``txid`` (run id ``txid-00000N``, its logical date on the txid
        grid, ``run_after`` now, so the grid says when it became due). Returns False if that run
        exists already (409): creating it twice is harmless, so the request may be sent again.
        A running task creates it with :func:`create_txid_run_from_task` instead."""
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns"
        body: dict[str, Any] = {
            "dag_run_id": txid_run_id(txid),
            "logical_date": txid_logical_date(txid).isoformat(),
            "run_after": datetime.now(UTC).isoformat(),
        }
        response = self._authorized("POST", path, repeatable=True, json=body)
        if response.status_code == 409:
            return False
        _raise_for_status("POST", path, response)
        return True

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any] | None:
        """One run (``dag_run_id``, ``state``, ``note``, …), or ``None`` if there is none."""
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}"
        response = self._authorized("GET", path)
        if response.status_code == 404:
            return None
        _raise_for_status("GET", path, response)
        return dict(response.json())

    def run_at(self, dag_id: str, logical_date: datetime) -> dict[str, Any] | None:
        """The run of ``dag_id`` whose logical date is ``logical_date`` (Airflow allows one), or
        ``None``."""
        found = self.request(
            "GET",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns",
            params={
                "logical_date_gte": logical_date.isoformat(),
                "logical_date_lte": logical_date.isoformat(),
                "limit": 1,
            },
        )
        runs = (found or {}).get("dag_runs", [])
        return dict(runs[0]) if runs else None

    def task_ids(self, dag_id: str) -> list[str]:
        """Every task of ``dag_id``, as the api-server's parsed DAG has them."""
        found = self.request("GET", f"/api/v2/dags/{quote(dag_id)}/tasks")
        return sorted(task["task_id"] for task in found.get("tasks", []))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The task instances of one run (``task_id``, ``state``, …)."""
        found = self.request(
            "GET", f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}/taskInstances"
        )
        return list(found.get("task_instances", []))

    def set_run_note(self, dag_id: str, run_id: str, note: str) -> None:
        """The note the grid shows on a run."""
        self.request(
            "PATCH",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}",
            params={"update_mask": "note"},
            json={"note": note[:1000]},
        )

    def finished_runs_through(self, dag_id: str, through: datetime, *, limit: int) -> list[str]:
        """Ids of the oldest finished (success or failed) txid runs of ``dag_id`` whose
        logical date is at most ``through``, oldest first, at most ``limit``."""
        found = self.request(
            "GET",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns",
            params={
                "logical_date_lte": through.isoformat(),
                "state": ["success", "failed"],
                # txid runs, whoever made them: the waker (manual), a claim (operator_triggered
                # from 3.3 on) or, in older DAGs, the timetable (scheduled)
                "run_id_prefix_pattern": "txid-",
                "order_by": "logical_date",
                "limit": limit,
            },
        )
        return [str(run["dag_run_id"]) for run in (found or {}).get("dag_runs", [])]

    def unfinished_runs_from(self, dag_id: str, start: datetime) -> list[str]:
        """Ids of the queued and running runs of ``dag_id`` whose logical date is at least
        ``start``."""
        found = self.request(
            "GET",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns",
            params={
                "logical_date_gte": start.isoformat(),
                "state": ["queued", "running"],
                "order_by": "logical_date",
                "limit": 1000,
            },
        )
        return [str(run["dag_run_id"]) for run in (found or {}).get("dag_runs", [])]

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> None:
        """Mark a run ``success`` or ``failed`` (Airflow ends its unfinished tasks with it)."""
        self.request(
            "PATCH",
            f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}",
            params={"update_mask": "state"},
            json={"state": state},
        )

    def set_paused(self, dag_id: str, paused: bool) -> bool:
        """Pause or unpause ``dag_id``; returns whether it was paused before."""
        path = f"/api/v2/dags/{quote(dag_id)}"
        was = bool(self.request("GET", path).get("is_paused"))
        if was != paused:
            self.request(
                "PATCH", path, params={"update_mask": "is_paused"}, json={"is_paused": paused}
            )
        return was

    def delete_dag_run(self, dag_id: str, run_id: str) -> bool:
        """Delete one run (Airflow deletes its task instances and XComs with it). Returns False
        if it was gone already (404): deleting twice is harmless. A running run is refused (409,
        raised): only finished runs are deleted."""
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}"
        response = self._authorized("DELETE", path)
        if response.status_code == 404:
            return False
        _raise_for_status("DELETE", path, response)
        return True

    def prune_txid_runs(self, dag_id: str, through_txid: int, *, limit: int = 50) -> list[str]:
        """Retention: delete up to ``limit`` finished runs of txids up to ``through_txid``, oldest
        first (one list request, one delete per run); returns the run ids deleted."""
        if through_txid < 1:
            return []
        deleted = []
        for run_id in self.finished_runs_through(
            dag_id, txid_logical_date(through_txid), limit=limit
        ):
            txid = txid_from_run_id(run_id)
            if txid is None or txid > through_txid:  # not a txid run, or a newer one: kept
                continue
            if self.delete_dag_run(dag_id, run_id):
                deleted.append(run_id)
        return deleted

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with a bearer token (fetched once per process and connection, renewed on a
        401); returns the JSON."""
        response = self._authorized(method, path, **kwargs)
        _raise_for_status(method, path, response)
        return response.json() if response.content else None

    # -- plumbing ----------------------------------------------------------------------------------

    def _authorized(self, method: str, path: str, **kwargs: Any) -> Any:
        """The response to one call with a bearer token, renewed once on a 401."""
        for renew in (False, True):
            response = self._send(method, path, token=self._get_token(renew=renew), **kwargs)
            if response.status_code != 401:
                break
        return response

    def _get_token(self, *, renew: bool = False) -> str:
        if self._token is None or renew:
            conn = self.get_connection(self.airflow_api_conn_id)
            if conn.login:
                body = {"username": conn.login, "password": conn.password or ""}
                response = self._send("POST", "/auth/token", repeatable=True, json=body)
            else:
                response = self._send("GET", "/auth/token")
            if response.status_code >= 400:
                # The body may echo what was sent: report the status and the user, nothing else.
                raise RequeueError(
                    f"the api-server refused a token for user {conn.login or '(none)'!r} "
                    f"(HTTP {response.status_code}); check connection {self.airflow_api_conn_id!r}"
                )
            self._token = _tokens[self.airflow_api_conn_id] = str(response.json()["access_token"])
        return self._token

    def _send(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        repeatable: bool | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send, retrying while the api-server is away. ``repeatable``: whether sending it twice
        does no harm (default: any method but POST); if not, it is sent again only when it surely
        was not processed."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = self.base_url() + path
        repeatable = method != "POST" if repeatable is None else repeatable
        retry_status = RETRY_STATUS if repeatable else UNPROCESSED_STATUS
        backoff = self.backoff()
        started = time.monotonic()
        for attempt in itertools.count(1):
            try:
                response = shared_client(self.timeout).request(
                    method, url, headers=headers, **kwargs
                )
                if response.status_code not in retry_status:
                    return response
                problem = f"HTTP {response.status_code}"
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # never reached the server
                response, problem = None, f"{type(err).__name__}: {err}"
            except httpx.TransportError as err:
                if not repeatable:
                    raise RequeueError(
                        f"{method} {url} may or may not have been processed "
                        f"({type(err).__name__}: {err}); not sent again"
                    ) from err
                response, problem = None, f"{type(err).__name__}: {err}"
            waited = time.monotonic() - started
            if backoff.out_of_time(waited):
                if response is not None:
                    return response  # the caller reports the status and body
                raise RequeueError(f"{method} {url} failed for {waited:.0f} s: {problem}") from None
            pause = backoff.wait(attempt)
            self.log.warning(
                "%s %s: %s (the api-server may be restarting); retrying in %.1f s, %.0f of %.0f s",
                method,
                url,
                problem,
                pause,
                waited,
                self.outage_timeout,
            )
            time.sleep(pause)
        raise AssertionError("unreachable")

    def test_connection(self) -> tuple[bool, str]:
        try:
            self._get_token(renew=True)
        except Exception as err:  # report, don't raise: this backs the UI's "Test" button
            return False, str(err)
        return True, "Token granted"


def create_txid_run_from_task(dag_id: str, txid: int) -> bool:
    """:meth:`AirflowApiHook.create_txid_run`, asked of the running task's supervisor
    (:func:`~airflow_txn_provider.compat.airflow.trigger_run_from_task`): the same run, without
    a connection, an HTTP client or a token of the task's own."""
    return trigger_run_from_task(
        dag_id,
        txid_run_id(txid),
        logical_date=txid_logical_date(txid),
        run_after=datetime.now(UTC),
    )


def _raise_for_status(method: str, path: str, response: Any) -> None:
    if response.status_code >= 400:
        raise RequeueError(
            f"{method} {path} answered {response.status_code}: {response.text[:500]}"
        )
