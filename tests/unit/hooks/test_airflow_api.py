"""The REST hook's retries, against a small HTTP server on loopback that answers as scripted: a
request that may be repeated is asked again while the api-server is away; a POST (a clear) is sent
again only when it surely was not processed, since clearing twice kills what the first clear
started."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_txn_provider.hooks import airflow_api
from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
from airflow_txn_provider.rules.exceptions import RequeueError
from txn_testing.postgres import free_port

TIMEOUT = 2.0
"""The hook's read timeout: long enough that a loaded machine's server answers within it."""
SLOW = TIMEOUT + 1.5
"""How long a ``"slow"`` answer takes: past the timeout."""


class Scripted(ThreadingHTTPServer):
    """Answers the n-th request with ``answers[n]`` (the last one repeated): a status, or
    ``"slow"`` to answer 200 after the client gave up. Records each request's method."""

    def __init__(self, answers: list[int | str]) -> None:
        self.answers = answers
        self.seen: list[str] = []
        self.paths: list[str] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(self.command)
        answers = self.server.answers
        answer = answers[min(len(self.server.seen), len(answers)) - 1]
        if answer == "slow":
            time.sleep(SLOW)
            answer = 200
        self.server.paths.append(self.path)
        found = {"access_token": "t0k3n"} if self.path.startswith("/auth/token") else {}
        body = json.dumps({"task_instances": [], **found}).encode()
        self.send_response(int(answer))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def serve():
    servers = []

    def start(answers: list[int | str]) -> tuple[Scripted, AirflowApiHook]:
        server = Scripted(answers)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, hook_for(f"http://127.0.0.1:{server.server_address[1]}")

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def hook_for(url: str) -> AirflowApiHook:
    hook = AirflowApiHook(timeout=TIMEOUT, outage_timeout=3.0)
    hook.base_url = lambda: url  # type: ignore[method-assign]
    hook._token = "token"  # no /auth/token round trip
    return hook


def clear(hook: AirflowApiHook) -> list[str]:
    return hook.clear_task_instances("words", ["process"], run_id="txid-000001")


def test_a_read_is_asked_again_while_the_server_restarts(serve):
    server, hook = serve([503, 500, 200])
    assert hook.task_instances("words", "txid-000001") == []
    assert server.seen == ["GET", "GET", "GET"]


def test_a_clear_answered_unavailable_was_not_processed_so_it_is_sent_again(serve):
    server, hook = serve([503, 502, 200])
    assert clear(hook) == []
    assert server.seen == ["POST"] * 3


@pytest.mark.parametrize("answer", [500, 504])
def test_a_clear_that_may_have_been_processed_is_not_sent_again(serve, answer):
    server, hook = serve([answer, 200])
    with pytest.raises(RequeueError, match=f"answered {answer}"):
        clear(hook)
    assert server.seen == ["POST"]


def test_a_clear_whose_answer_timed_out_is_not_sent_again(serve):
    server, hook = serve(["slow", 200])
    with pytest.raises(RequeueError, match="may or may not have been processed"):
        clear(hook)
    time.sleep(SLOW)  # the server finished the slow answer: still one request
    assert server.seen == ["POST"]


def test_a_clear_is_sent_again_while_nothing_listens_then_reported():
    hook = hook_for(f"http://127.0.0.1:{free_port()}")
    hook.outage_timeout = 1.0
    with pytest.raises(RequeueError, match="failed for"):
        clear(hook)


def test_hooks_of_one_process_share_a_client_and_a_token(serve, monkeypatch):
    """A task creates a hook per txid: the second asks for no token and builds no HTTP client
    (its SSL context costs tens of ms of CPU), and keeps the connection open."""
    server, _ = serve([200])
    url = f"http://127.0.0.1:{server.server_address[1]}"
    conn = json.dumps({"conn_type": "airflow_api", "host": "127.0.0.1"})
    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_API_DEFAULT", conn)
    airflow_api._tokens.pop(AirflowApiHook.default_conn_name, None)
    for _ in range(3):
        hook = AirflowApiHook(timeout=TIMEOUT, outage_timeout=3.0)
        hook.base_url = lambda: url  # type: ignore[method-assign]
        assert hook.task_instances("words", "txid-000001") == []
    assert server.paths.count("/auth/token") == 1
    assert len(server.paths) == 4
    assert airflow_api.shared_client(TIMEOUT) is airflow_api.shared_client(TIMEOUT)


def test_a_forked_child_uses_none_of_its_parents_clients_or_tokens():
    parent = airflow_api.shared_client(TIMEOUT)
    airflow_api._tokens["somewhere"] = "parent's"
    airflow_api._forget_parent_clients()  # what os.register_at_fork runs in the child
    assert airflow_api.shared_client(TIMEOUT) is not parent
    # the SSL context (no socket, costly to build) is the parent's: the preload built it
    assert airflow_api.shared_client(TIMEOUT)._transport._pool._ssl_context is (
        airflow_api.shared_ssl_context()
    )
    assert AirflowApiHook("somewhere")._token is None
