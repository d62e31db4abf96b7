"""The Docker stack in docker/, checked statically: no Docker engine runs on our build machines,
so the image is never built and the stack never started here.

What is checked is what would break a deployment silently: a service, healthcheck or dependency
missing; an Airflow command, setting or connection that differs from what the tested local stack
(``txn_testing.airflow.AirflowStack``, with its Celery broker) runs; a broker that
is published, or that the executor does not point at; Celery workers that cannot scale or whose
healthcheck pings another node; a connection that points at no service or that the project's
hooks cannot read; a volume not declared or not shared where the sources read; a required
variable missing from ``.env.example``; a Dockerfile that installs another pyspark than the
Makefile, copies what the build context does not hold, or runs as root.

And the stack's safe defaults (docs/deployment.md, "Threat model"): Spark Connect's gRPC port
published by no service under any profile; the Spark UIs published only by a service under the
``spark-ui`` profile, on 127.0.0.1; the one bind-address setting moves the Airflow UI only;
failure injection off unless asked for; the failure sensor's REST connection on an API user of
its own, not the admin, with the least role of Airflow's auth manager that its calls need (read
from the api-server's routes), and the admin's password given to no service that runs tasks.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from threading import Thread
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from packaging.specifiers import SpecifierSet
from sqlalchemy.engine import make_url

from airflow_txn_provider.compat.python import UTC
from txn_testing.airflow import CELERY_WORKER, AirflowStack
from txn_testing.postgres import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"
POSTGRES_INIT = DOCKER / "postgres-init.sh"

# Long-running Airflow services and the AirflowStack component each runs (the worker service,
# scaled, is what the tested stack's ``celery-worker-N`` components are)
WORKER = "airflow-worker"
AIRFLOW_SERVICES = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    WORKER: CELERY_WORKER.format(1),
}
SPARK_SERVICES = ("spark-master", "spark-worker", "spark-connect")
ONE_SHOT = "airflow-init"
BROKER = "redis"
KAFKA = "kafka"  # the Kafka sources' cluster (example_txn_kafka_words)
API_SERVER = "airflow-api-server"
# The Spark UIs' forwarder, and the profile it runs under: the only way a Spark UI is published
SPARK_UI, SPARK_UI_PROFILE = "spark-ui", "spark-ui"
EXPECTED_SERVICES = {
    "postgres",
    BROKER,
    KAFKA,
    ONE_SHOT,
    SPARK_UI,
    *AIRFLOW_SERVICES,
    *SPARK_SERVICES,
}
# Services that run the project's code (all but postgres and redis) and the official images
IMAGE_SERVICES = {ONE_SHOT, SPARK_UI, *AIRFLOW_SERVICES, *SPARK_SERVICES}
# The UI admin's password: airflow-init's alone (it writes the password file); tasks never see it
ADMIN_PASSWORD = "AIRFLOW_ADMIN_PASSWORD"
OFFICIAL_IMAGES = {"postgres": "postgres:15", BROKER: "redis:7", KAFKA: "apache/kafka:3.9.1"}
# The services the CeleryExecutor's broker connects: the scheduler sends, the workers take
BROKER_CLIENTS = {"airflow-scheduler", WORKER}
# Where the sources read and every Spark process and Airflow task must see the same files (the
# workers run the processing tasks; begin and its triggers read the sources' footers)
DATA_VOLUME = "txn-data"
DATA_READERS = {*AIRFLOW_SERVICES, "spark-worker", "spark-connect"}
# AirflowStack's broker (txn_testing/redis.py binds to loopback): the stack's is the redis service
TESTED_BROKER = "redis://127.0.0.1:6379/0"
# How many Celery workers the tested stack runs by default: the worker service's default replicas
TESTED_WORKERS = inspect.signature(AirflowStack).parameters["celery_workers"].default

# Settings of AirflowStack that the deployment leaves out on purpose, and why. Any other setting
# of AirflowStack missing from compose.yaml fails test_airflow_settings_match_the_tested_stack.
LEFT_TO_DEFAULTS = {
    "AIRFLOW_HOME": "set by the image (Dockerfile ENV), checked separately",
    "AIRFLOW__CORE__PARALLELISM": "capped for the 2-core test machine; Airflow's default in prod",
    "AIRFLOW__API__HOST": "the api-server's command line (--host)",
    "AIRFLOW__API__PORT": "the api-server's command line (--port)",
    "AIRFLOW__API__WORKERS": "Airflow's default (1)",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "shortened for test speed",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "shortened for test speed",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO is Airflow's default",
    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "a test device: the tests' Celery workers share one "
    "machine and each needs a hostname of its own; a container has one, Airflow's default finds it",
}
# Settings whose value must be the tested one (worker concurrency: .env.example's default)
SAME_VALUE = (
    "AIRFLOW__CORE__EXECUTOR",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION",
    "AIRFLOW__CELERY__WORKER_CONCURRENCY",
    "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER",
)
# Options of AirflowStack.component_argv that the services' commands leave out or add, and why.
# Any other difference fails test_airflow_commands_are_the_tested_stacks.
COMMAND_DIFFERENCES = {
    "--host": "the api-server listens on the container's network, not on loopback only",
    "--celery-hostname": "the tests' workers share one machine, so each gets a name; each "
    "container has its own hostname, and the healthcheck pings Celery's default celery@<hostname>",
    "--skip-serve-logs": "the tests' workers share one machine (and one log-server port); here "
    "each worker serves its running tasks' logs on 8793 to the api-server, finished ones are on "
    "the shared logs volume",
}

# A subset of the Compose specification's keys (compose-spec's JSON schema): a key outside it is
# most likely a typo that Compose would reject, or worse, that YAML hides (``depend_on``).
TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "secrets", "configs", "include"}
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "volumes", "ports",
    "expose", "depends_on", "healthcheck", "restart", "deploy", "hostname", "user", "working_dir",
    "networks", "labels", "profiles", "stop_grace_period", "stop_signal", "init", "tmpfs",
    "ulimits", "shm_size", "logging", "extra_hosts", "secrets", "configs", "scale", "pull_policy",
    "read_only", "cap_add", "cap_drop", "security_opt", "mem_limit", "cpus",
}  # fmt: skip
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
RESTART = re.compile(r"no|always|unless-stopped|on-failure(:\d+)?")

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $VAR; $$ is a literal $
_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable interpolation of one value."""

    def value(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["name"] or m["bare"]
        op, arg, got = m["op"], m["arg"], env.get(name)
        if op in (":-", "-"):
            return got if got or (op == "-" and got is not None) else arg
        if op in (":?", "?") and (got is None or (op == ":?" and got == "")):
            raise MissingVariable(f"{name}: {arg}")
        return got or ""

    return _INTERPOLATION.sub(value, text)


def variables_used(text: str) -> dict[str, set[str | None]]:
    """Each variable compose.yaml interpolates, with the defaults it gives it (None: required,
    no default)."""
    used: dict[str, set[str | None]] = {}
    for m in _INTERPOLATION.finditer(text):
        if m["escaped"]:
            continue
        name, op = m["name"] or m["bare"], m["op"]
        used.setdefault(name, set()).add(m["arg"] if op in (":-", "-") else None)
    return used


def env_example() -> tuple[set[str], dict[str, str]]:
    """.env.example: the required variables (``VAR=`` lines) and the optional ones with the
    default they show (``# VAR=default`` lines)."""
    required, optional = set(), {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if m := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line.strip()):
            required.add(m[1])
        elif m := re.fullmatch(r"#\s*([A-Z][A-Z0-9_]*)=(\S*)", line.strip()):
            optional[m[1]] = m[2]
    return required, optional


def dummy_env() -> dict[str, str]:
    """What a filled-in docker/.env holds: a value for each required variable."""
    required, _ = env_example()
    return {name: f"dummy-{name.lower().replace('_', '-')}" for name in required}


def _interpolate_all(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_all(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_all(item, env) for key, item in node.items()}
    return node


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """compose.yaml as YAML (anchors and ``<<`` merge keys resolved), not interpolated."""
    return dict(yaml.safe_load(COMPOSE.read_text()))


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """compose.yaml as Compose reads it with a filled-in docker/.env."""
    return dict(_interpolate_all(raw, dummy_env()))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(arg) for arg in cmd]


def option(cmd: list[str], name: str) -> str:
    """The value of ``--name VALUE`` in an argument list."""
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def spark_confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")


def airflow_env(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The Airflow environment where the tasks run (every Airflow service has the same)."""
    return dict(services[WORKER]["environment"])


def connection(services: dict[str, dict[str, Any]], conn_id: str) -> dict[str, Any]:
    value = airflow_env(services)[f"AIRFLOW_CONN_{conn_id.upper()}"]
    return dict(json.loads(value))


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """target path -> source (a named volume or a host path) of a service's short-form volumes."""
    mounts = {}
    for spec in service.get("volumes", []):
        assert isinstance(spec, str), f"use the short volume syntax: {spec}"
        source, target = spec.split(":")[:2]
        mounts[target] = source
    return mounts


def cli_options(argv: list[str]) -> dict[str, str | None]:
    """``--name`` -> its value (None for a flag) in an argument list."""
    return {
        arg: nxt if nxt is not None and not nxt.startswith("-") else None
        for arg, nxt in itertools.zip_longest(argv, argv[1:])
        if arg.startswith("-")
    }


def positional(argv: list[str]) -> list[str]:
    """The subcommand words of an argument list, up to its first option."""
    return list(itertools.takewhile(lambda arg: not arg.startswith("-"), argv))


def redis_port(services: dict[str, dict[str, Any]]) -> int:
    cmd = command(services[BROKER])
    return int(option(cmd, "--port")) if "--port" in cmd else 6379  # redis-server's default


def published_ports(service: dict[str, Any]) -> Iterator[tuple[str, int, int]]:
    """(host address, host port, container port) of each published port."""
    for spec in service.get("ports", []):
        address, host, target = str(spec).rsplit(":", 2)
        yield address, int(host), int(target)


def simple_auth_users(env: Mapping[str, str]) -> dict[str, str]:
    """user -> role of the simple auth manager's ``[core] simple_auth_manager_users``."""
    value = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    return dict(user.strip().split(":")[:2] for user in value.split(","))


def forwarder_routes(service: dict[str, Any]) -> list[tuple[str, int, str, int]]:
    """(listen address, listen port, target host, target port) of each ``[ADDRESS:]PORT=HOST:PORT``
    argument of the spark-ui forwarder (``python -c SCRIPT ROUTE…``)."""
    cmd = command(service)
    assert cmd[:2] == ["python", "-c"], cmd[:2]
    routes = []
    for route in cmd[3:]:
        listen, _, target = route.partition("=")
        address, _, port = listen.rpartition(":")
        host, _, target_port = target.rpartition(":")
        routes.append((address, int(port), host, int(target_port)))
    return routes


def spark_ui_ports(services: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Spark node -> the container port of its web UI."""
    return {
        "spark-master": int(option(command(services["spark-master"]), "--webui-port")),
        "spark-worker": int(option(command(services["spark-worker"]), "--webui-port")),
        "spark-connect": int(spark_confs(command(services["spark-connect"]))["spark.ui.port"]),
    }


def spark_connect_port(services: dict[str, dict[str, Any]]) -> int:
    confs = spark_confs(command(services["spark-connect"]))
    return int(confs["spark.connect.grpc.binding.port"])


# -- the compose file ---------------------------------------------------------------------------


def test_compose_has_only_known_keys(raw):
    assert {k for k in raw if not k.startswith("x-")} <= TOP_LEVEL_KEYS
    for name, service in raw["services"].items():
        assert set(service) <= SERVICE_KEYS, f"{name}: unknown keys {set(service) - SERVICE_KEYS}"
        assert set(service.get("healthcheck", {})) <= HEALTHCHECK_KEYS, name
        # `restart: no` unquoted is the boolean false in YAML, which Compose rejects
        assert RESTART.fullmatch(str(service.get("restart", "no"))), name
        assert isinstance(service.get("restart", "no"), str), f"{name}: quote restart's value"
        for key, value in (service.get("environment") or {}).items():
            # an unquoted False/5432 would reach the container as "false"/a YAML number
            assert isinstance(value, str), f"{name}: quote {key}'s value"


def test_every_service_is_there(services):
    assert EXPECTED_SERVICES <= set(services)
    assert set(AIRFLOW_SERVICES.values()) == set(_tested_stack(celery_workers=1).components)


def test_services_run_the_project_image(services):
    images = set()
    for name in IMAGE_SERVICES:
        build = services[name]["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE, name
        images.add(services[name]["image"])
    assert len(images) == 1, f"one image for every service, found {images}"
    for name, image in OFFICIAL_IMAGES.items():
        assert services[name]["image"] == image, name
        assert "build" not in services[name], name


def test_airflow_services_share_one_configuration(services):
    envs = [services[name]["environment"] for name in AIRFLOW_SERVICES]
    assert all(env == envs[0] for env in envs)
    # airflow-init: the same, plus the admin's password (for the password file), nothing else
    init = dict(services[ONE_SHOT]["environment"])
    assert init.pop(ADMIN_PASSWORD) and init == envs[0]


def test_long_running_services_have_healthchecks(services):
    for name, service in services.items():
        if name == ONE_SHOT:
            assert "healthcheck" not in service
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert service.get("restart") == "unless-stopped", name
    assert services[ONE_SHOT]["restart"] == "no"


def test_healthchecks_probe_what_the_service_serves(services):
    def http_port(name: str) -> int:
        urls = [arg for arg in services[name]["healthcheck"]["test"] if "://" in arg]
        assert len(urls) == 1, name
        url = urlsplit(urls[0])
        assert url.hostname == "localhost", name
        return int(url.port or 80)

    api = services["airflow-api-server"]
    assert api["healthcheck"]["test"][-1].endswith("/api/v2/monitor/health")
    assert http_port("airflow-api-server") == int(option(command(api), "--port"))
    for name in ("spark-master", "spark-worker"):
        assert http_port(name) == int(option(command(services[name]), "--webui-port")), name
    connect = services["spark-connect"]
    grpc_port = spark_confs(command(connect))["spark.connect.grpc.binding.port"]
    assert connect["healthcheck"]["test"][-1].endswith(f"/dev/tcp/127.0.0.1/{grpc_port}")
    listens = {listen for _, listen, _, _ in forwarder_routes(services[SPARK_UI])}
    probed = re.fullmatch(
        r"exec 3<>/dev/tcp/127\.0\.0\.1/(\d+)", services[SPARK_UI]["healthcheck"]["test"][-1]
    )
    assert probed and int(probed[1]) in listens
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"][-1]
    # redis-cli pings the default port unless told another (-p)
    ping = services[BROKER]["healthcheck"]["test"]
    assert ping[0] == "CMD" and ping[1:2] == ["redis-cli"] and ping[-1] == "ping"
    assert (int(option(ping, "-p")) if "-p" in ping else 6379) == redis_port(services)


def test_worker_healthcheck_pings_this_worker(services):
    """As Airflow's own docker-compose.yaml: ``celery inspect ping`` on Airflow's Celery app, to
    this container's node, which is Celery's default ``celery@<hostname>``."""
    from celery import Celery

    worker = services[WORKER]
    test = worker["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and len(test) == 2, "the shell runs $(hostname)"
    argv = shlex.split(test[1])
    assert argv[:2] == ["celery", "--app"]
    module, _, attr = argv[2].rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), attr), Celery), argv[2]
    # `hostname`, not $HOSTNAME: podman does not put HOSTNAME in a container's environment (the
    # stack test found the check failing there), and compose would expand a single $
    assert argv[3:] == ["inspect", "ping", "-d", "celery@$(hostname)"]
    # the node name stays Celery's default, which the ping names
    assert not {"-H", "--celery-hostname"} & set(command(worker))
    assert "hostname" not in worker


def test_airflow_healthchecks_are_valid_cli_calls(services):
    from airflow.cli import cli_parser

    parser = cli_parser.get_parser()
    job_types = {
        "airflow-scheduler": "SchedulerJob",
        "airflow-dag-processor": "DagProcessorJob",
        "airflow-triggerer": "TriggererJob",
    }
    for name, job_type in job_types.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "airflow"], name
        assert option(test, "--job-type") == job_type, name
        assert "--local" in test, f"{name}: check this container's job, not any"
        parser.parse_args(test[2:])  # exits (fails the test) if Airflow 3.3's CLI rejects it
    with pytest.raises(SystemExit):  # the parser does reject what it does not know
        parser.parse_args(["jobs", "check", "--job-type", "WorkerJob"])


def test_dependencies(services):
    for name in AIRFLOW_SERVICES:
        deps = services[name]["depends_on"]
        assert deps["postgres"] == {"condition": "service_healthy"}, name
        assert deps[ONE_SHOT] == {"condition": "service_completed_successfully"}, name
    assert services[ONE_SHOT]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    # the executor's broker: the scheduler sends tasks to it, the workers take them
    for name in BROKER_CLIENTS:
        assert services[name]["depends_on"][BROKER] == {"condition": "service_healthy"}, name
    # tasks (on the workers) use the execution API and Spark Connect; triggers the execution API
    worker = services[WORKER]["depends_on"]
    assert worker["airflow-api-server"]["condition"] == "service_healthy"
    assert worker["spark-connect"]["condition"] == "service_healthy"
    assert services["airflow-triggerer"]["depends_on"]["airflow-api-server"] == {
        "condition": "service_healthy"
    }
    for name in ("spark-worker", "spark-connect"):
        assert services[name]["depends_on"]["spark-master"]["condition"] == "service_healthy"

    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert spec["condition"] in CONDITIONS, name
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health"
            if spec["condition"] == "service_completed_successfully":
                assert services[dep]["restart"] == "no", f"{name} waits for {dep} to exit"

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle {' -> '.join((*path, name))}"
        for dep in services[name].get("depends_on") or {}:
            visit(dep, (*path, name))

    for name in services:
        visit(name, ())


# -- Airflow: the same commands and settings as the tested stack ---------------------------------


def _tested_stack(**kwargs: Any) -> AirflowStack:
    """The tested stack with its Celery broker, on the api-server's port of compose.yaml."""
    return AirflowStack(
        Path("/airflow"),
        "postgresql+psycopg2://u:p@db:5432/meta",
        Path("/dags"),
        port=8080,
        celery_broker=TESTED_BROKER,
        **kwargs,
    )


def _tested_stack_env() -> dict[str, str]:
    with mock.patch.dict(os.environ, {}, clear=True):
        env = _tested_stack().env()
    return {k: v for k, v in env.items() if k.startswith("AIRFLOW")}


def test_airflow_commands_are_the_tested_stacks(services):
    from airflow.cli import cli_parser

    parser = cli_parser.get_parser()
    stack = _tested_stack(celery_workers=1)
    differences = set()
    for name, component in AIRFLOW_SERVICES.items():
        cmd = command(services[name])
        tested = stack.component_argv(component)
        assert cmd[0] == "airflow", name
        assert positional(cmd[1:]) == positional(tested), name
        ours, theirs = cli_options(cmd[1:]), cli_options(tested)
        differences |= ours.keys() ^ theirs.keys()
        for opt in ours.keys() & theirs.keys():
            assert ours[opt] == theirs[opt], f"{name}: {opt}"
        parser.parse_args(cmd[1:])  # exits (fails the test) if Airflow's CLI rejects it
    assert differences == set(COMMAND_DIFFERENCES), "see COMMAND_DIFFERENCES"
    assert command(services[WORKER])[:3] == ["airflow", "celery", "worker"]


def test_init_runs_what_the_tested_stack_runs_before_its_components(services):
    from airflow_txn_provider.timetables import main as timetables_main

    # AirflowStack.start: `airflow db migrate`, the runs re-dated, the password file
    script = command(services[ONE_SHOT])
    assert script[:2] == ["bash", "-c"]
    assert "set -euo pipefail" in script[2], "a failed step must fail the init"
    lines = script[2].splitlines()
    migrate = lines.index("airflow db migrate")
    migrate_runs = lines.index("python -m airflow_txn_provider.timetables migrate-runs")
    assert migrate < migrate_runs, "the runs are re-dated in a migrated schema"
    start = inspect.getsource(AirflowStack.start)
    assert start.index('"db", "migrate"') < start.index('"airflow_txn_provider.timetables"')
    assert '"-m", "airflow_txn_provider.timetables", "migrate-runs"' in start
    with pytest.raises(SystemExit) as parsed:  # the module's CLI has that command
        timetables_main(["migrate-runs", "--help"])
    assert parsed.value.code == 0
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script[2]


def test_airflow_settings_match_the_tested_stack(services):
    env = airflow_env(services)
    tested = _tested_stack_env()
    missing = set(tested) - set(env) - set(LEFT_TO_DEFAULTS)
    assert not missing, f"AirflowStack sets {sorted(missing)}, compose.yaml does not"
    assert set(LEFT_TO_DEFAULTS) - {"AIRFLOW_HOME"} <= set(tested), "stale LEFT_TO_DEFAULTS"
    for key in SAME_VALUE:
        assert env[key] == tested[key], key
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    # the same fields in the api connection; the tested stack's one user is the admin, as the
    # deployment's UI user (the API user, the deployment's own, is checked on its own below)
    tested_api = json.loads(tested["AIRFLOW_CONN_AIRFLOW_API_DEFAULT"])
    assert set(tested_api) <= set(connection(services, "airflow_api_default"))
    (tested_user,) = simple_auth_users(tested).values()
    assert tested_user == "admin" and "admin" in simple_auth_users(env).values()


def test_celery_broker_and_results_match_the_tested_stack(services):
    env, tested = airflow_env(services), _tested_stack_env()
    # the broker: AirflowStack's URL, on the redis service instead of loopback
    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    tested_broker = urlsplit(tested["AIRFLOW__CELERY__BROKER_URL"])
    assert tested_broker.hostname == urlsplit(TESTED_BROKER).hostname == "127.0.0.1"
    assert broker.hostname == BROKER
    assert (broker.scheme, broker.path) == (tested_broker.scheme, tested_broker.path)
    assert broker.port == tested_broker.port == redis_port(services)

    # results: in the metadata database, with the driver AirflowStack gives it
    def results(e: dict[str, str]) -> Any:
        backend = e["AIRFLOW__CELERY__RESULT_BACKEND"]
        assert backend.startswith("db+"), backend
        return make_url(backend.removeprefix("db+"))

    driver = results(tested).drivername
    assert results(tested) == make_url(tested["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).set(
        drivername=driver
    )
    metadata = make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert results(env) == metadata.set(drivername=driver)


def test_redis_is_reached_inside_the_stack_only(services):
    redis = services[BROKER]
    assert "ports" not in redis, "the broker has no password: never publish its port"
    assert not {"network_mode", "networks"} & set(redis)
    # in memory only, as compose.yaml says (and txn_testing/redis.py runs it): no volume to keep
    cmd = command(redis)
    assert cmd[0] == "redis-server"
    assert option(cmd, "--save") == "" and option(cmd, "--appendonly") == "no"
    assert not redis.get("volumes")


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """Kafka's ``NAME://host:port,…`` listeners: ``{NAME: (host, port)}``."""
    found = {}
    for listener in value.split(","):
        name, _, address = listener.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def test_kafka_is_one_kraft_node_that_the_tasks_reach_inside_the_stack(services, monkeypatch):
    """The cluster's settings agree with each other and with ``kafka_default``, read by the
    project's own reader as a task would; plaintext, so published by no service."""
    from airflow_txn_provider.utils.credentials import kafka_config

    kafka = services[KAFKA]
    env = kafka["environment"]
    assert "ports" not in kafka, "plaintext, no authentication: never publish Kafka's port"
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    broker = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    protocols = dict(kv.split(":") for kv in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols) == {broker, controller}
    assert set(advertised) == {broker}, "clients are told the broker listener only"
    host, port = advertised[broker]
    assert host == kafka["hostname"] == KAFKA and port == listeners[broker][1]
    node, _, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert node == env["KAFKA_NODE_ID"] and voter == f"{host}:{listeners[controller][1]}"
    # a one-node cluster: internal topics with one replica, or they are never created
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key
    # Kafka refuses to format its storage with an id that is not 16 bytes of URL-safe base64
    cluster_id = env["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16 and len(cluster_id) == 22
    assert volume_mounts(kafka) == {env["KAFKA_LOG_DIRS"]: "kafka-data"}
    probe = kafka["healthcheck"]["test"]
    assert probe[1] == "/opt/kafka/bin/kafka-topics.sh"
    assert option(probe, "--bootstrap-server") == f"localhost:{listeners[broker][1]}"

    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DEFAULT", airflow_env(services)["AIRFLOW_CONN_KAFKA_DEFAULT"]
    )
    assert kafka_config("kafka_default")["bootstrap.servers"] == f"{host}:{port}"
    # the image reads it with confluent-kafka, from the lock it installs
    assert re.search(r"^confluent-kafka==", (ROOT / "requirements.lock").read_text(), re.M)


def test_metadata_database_urls(services):
    env = airflow_env(services)
    sync = make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    async_ = make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"])
    # asyncpg is not installed: the async engine must use psycopg 3, as in AirflowStack
    assert async_.drivername == "postgresql+psycopg"
    assert async_.set(drivername=sync.drivername) == sync
    assert sync.host == "postgres" and sync.database == "airflow"
    assert sync.username == services["postgres"]["environment"]["AIRFLOW_DB_USER"]
    assert sync.password == services["postgres"]["environment"]["AIRFLOW_DB_PASSWORD"]


def test_execution_api_and_base_url(services):
    env = airflow_env(services)
    url = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert url.hostname == "airflow-api-server" and url.path == "/execution/"
    assert url.port == int(option(command(services["airflow-api-server"]), "--port"))
    assert env["AIRFLOW__API__BASE_URL"].startswith("http")


def test_secrets_are_required_variables_not_values(raw):
    """Every secret comes from docker/.env (``${VAR:?...}``): none is written in the file."""
    secret = re.compile(r"(PASSWORD|SECRET|FERNET_KEY|SECRET_KEY)$")
    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if secret.search(key):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]+\}", value), f"{name}: {key}={value}"
    env = raw["services"][WORKER]["environment"]
    for key in ("AIRFLOW_CONN_TXN_LOG_DEFAULT", "AIRFLOW_CONN_AIRFLOW_API_DEFAULT"):
        assert re.search(r'"password": "\$\{[A-Z0-9_]+:\?[^}]+\}"', env[key]), key
    with pytest.raises(MissingVariable):  # and Compose refuses to start without them
        _interpolate_all(raw, {})


# -- connections -------------------------------------------------------------------------------


def _hooks() -> dict[str, type]:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from airflow_txn_provider.hooks.airflow_api import AirflowApiHook
    from airflow_txn_provider.hooks.spark_submit import TxnSparkSubmitHook
    from airflow_txn_provider.hooks.txn_log import TxnLogHook

    return {
        "txn_log": TxnLogHook,
        "airflow_api": AirflowApiHook,
        "spark_connect": SparkConnectHook,
        "spark": TxnSparkSubmitHook,
    }


def test_each_default_connection_has_its_hooks_type(services):
    env = airflow_env(services)
    for conn_type, hook in _hooks().items():
        key = f"AIRFLOW_CONN_{hook.default_conn_name.upper()}"
        assert key in env, f"{hook.__name__} reads {key}"
        assert json.loads(env[key])["conn_type"] == conn_type == hook.conn_type


def test_connections_point_at_the_services(services, monkeypatch):
    """Read each connection with the hook that uses it, as a task in the stack would."""
    for key, value in airflow_env(services).items():
        if key.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(key, value)
    hooks = _hooks()

    txn = hooks["txn_log"]().sqlalchemy_url
    pg = services["postgres"]["environment"]
    assert (txn.host, txn.port, txn.database) == ("postgres", 5432, "txn")
    assert (txn.username, txn.password) == (pg["TXN_DB_USER"], pg["TXN_DB_PASSWORD"])
    assert re.search(r"^CREATE DATABASE txn OWNER :\"txn_user\";$", POSTGRES_INIT.read_text(), re.M)
    assert re.search(r"^CREATE DATABASE airflow ", POSTGRES_INIT.read_text(), re.M)

    connect = urlsplit(hooks["spark_connect"]().get_connection_url())
    connect_cmd = command(services["spark-connect"])
    assert connect.scheme == "sc" and connect.hostname == "spark-connect"
    assert connect.port == int(spark_confs(connect_cmd)["spark.connect.grpc.binding.port"])

    submit = hooks["spark"](conn_id="spark_default")
    master = submit.master
    master_cmd = command(services["spark-master"])
    assert master == f"spark://{option(master_cmd, '--host')}:{option(master_cmd, '--port')}"
    assert urlsplit(master).hostname in services
    assert submit.deploy_mode == "client"  # Python apps: standalone is client-only
    assert command(services["spark-worker"])[-1] == master
    assert option(connect_cmd, "--master") == master

    api = urlsplit(hooks["airflow_api"]().base_url())
    assert api.hostname == "airflow-api-server"
    assert api.port == int(option(command(services["airflow-api-server"]), "--port"))


def test_spark_connect_driver_is_reachable_by_executors(services):
    connect = services["spark-connect"]
    confs = spark_confs(command(connect))
    assert confs["spark.driver.host"] == "spark-connect" == connect["hostname"]
    assert confs["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert confs["spark.driver.bindAddress"] == "0.0.0.0"
    assert command(connect)[:3] == [
        "spark-submit",
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
    ]


@pytest.mark.parametrize(
    ("name", "replicas", "argv"),
    [
        (
            "spark-worker",
            "${SPARK_WORKERS:-1}",
            ["spark-class", "org.apache.spark.deploy.worker.Worker"],
        ),
        # as many as the tested stack runs by default
        (
            WORKER,
            f"${{AIRFLOW_WORKERS:-{TESTED_WORKERS}}}",
            ["airflow", "celery", "worker"],
        ),
    ],
)
def test_workers_scale(services, raw, name, replicas, argv):
    worker = services[name]
    assert "ports" not in worker, "a published port would stop a second replica from starting"
    assert "hostname" not in worker and "container_name" not in worker
    assert raw["services"][name]["deploy"]["replicas"] == replicas
    # podman-compose starts one replica unless the mode (Compose's default) is said: the stack
    # test found one Celery worker and one Spark worker where two were asked for
    assert raw["services"][name]["deploy"]["mode"] == "replicated"
    assert command(worker)[: len(argv)] == argv


def test_published_ports(services):
    seen: dict[int, str] = {}
    for name, service in services.items():
        for address, host, _target in published_ports(service):
            assert address == "127.0.0.1", f"{name}: by default, every port on loopback only"
            assert host not in seen, f"{name} and {seen.get(host)} both publish {host}"
            seen[host] = name
    assert {t for _, _, t in published_ports(services["airflow-api-server"])} == {8080}


# -- safe defaults: what is published, failure injection, the API user -------------------------


def test_spark_connect_is_published_by_no_service(raw, services):
    """Whoever reaches Spark Connect's gRPC port runs code on Spark (no authentication): only
    this stack's network reaches it, under every profile."""
    grpc = spark_connect_port(services)
    assert "ports" not in services["spark-connect"], "spark-connect publishes a port"
    for name, service in services.items():  # every service, profiled or not
        assert "network_mode" not in service, f"{name} shares a network namespace"
        for _address, host, target in published_ports(service):
            assert grpc not in (host, target), f"{name} publishes Spark Connect's port {grpc}"
    for route in forwarder_routes(services[SPARK_UI]):
        assert route[2:] != ("spark-connect", grpc), "the UI forwarder forwards Spark Connect"
    # nor its default port, whatever the conf says
    assert not re.search(r"\b15002:", COMPOSE.read_text())


def test_spark_uis_are_published_only_under_a_profile_on_loopback(raw, services):
    for name in SPARK_SERVICES:
        assert "ports" not in services[name], f"{name} publishes its UI without a profile"
    publishers = {name for name, service in services.items() if service.get("ports")}
    assert publishers - {API_SERVER} == {SPARK_UI}
    ui = raw["services"][SPARK_UI]
    assert ui["profiles"] == [SPARK_UI_PROFILE]
    # the host address is 127.0.0.1 itself, not a setting that could be 0.0.0.0
    for spec in ui["ports"]:
        assert str(spec).startswith("127.0.0.1:"), spec
    # it forwards exactly the master's UI and the Connect driver's UI, to the ports it publishes
    uis = spark_ui_ports(services)
    routes = forwarder_routes(services[SPARK_UI])
    assert {(host, port) for _, _, host, port in routes} == {
        ("spark-master", uis["spark-master"]),
        ("spark-connect", uis["spark-connect"]),
    }
    assert all(address == "" for address, _, _, _ in routes), "all the container's interfaces"
    published = {target for _, _, target in published_ports(services[SPARK_UI])}
    assert published == {listen for _, listen, _, _ in routes}
    # no service without the profile needs it (Compose would refuse, or start it)
    for name, service in services.items():
        assert SPARK_UI not in (service.get("depends_on") or {}), name


def test_the_bind_address_setting_moves_the_airflow_ui_only(raw):
    """Setting any variable of a published port's address to 0.0.0.0 exposes the api-server
    (authenticated) and nothing else; by default everything is on 127.0.0.1
    (test_published_ports)."""
    settable = set()
    for service in raw["services"].values():
        for spec in service.get("ports", []):
            address = str(spec).rsplit(":", 2)[0]
            settable |= set(variables_used(address))
    for variable in settable:
        compose = _interpolate_all(raw, {**dummy_env(), variable: "0.0.0.0"})
        exposed = {
            name
            for name, service in compose["services"].items()
            if any(address != "127.0.0.1" for address, _, _ in published_ports(service))
        }
        assert exposed == {API_SERVER}, f"{variable}=0.0.0.0 exposes {exposed}"
    assert settable == {"AIRFLOW_UI_BIND_ADDRESS"}
    _, optional = env_example()
    assert optional["AIRFLOW_UI_BIND_ADDRESS"] == "127.0.0.1"


def test_failure_injection_is_off_unless_asked_for(raw, monkeypatch):
    from airflow_txn_provider import failure_injection

    (key,) = failure_injection.ENABLE_ENV
    value = raw["services"][WORKER]["environment"][key]

    def enabled(env: Mapping[str, str]) -> bool:
        monkeypatch.setenv(key, interpolate(value, env))
        return failure_injection.enabled()

    assert not enabled(dummy_env()), "failure injection is on by default"
    _, optional = env_example()
    (switch,) = variables_used(value)
    assert not enabled({**dummy_env(), switch: optional[switch]}), ".env.example turns it on"
    assert enabled({**dummy_env(), switch: "True"}), f"{switch}=True turns it on"


def test_failure_sensor_has_an_api_user_of_its_own(raw, services):
    conn = connection(services, "airflow_api_default")
    users = simple_auth_users(airflow_env(services))
    admins = [user for user, role in users.items() if role.upper() == "ADMIN"]
    assert len(admins) == 1, users
    assert conn["login"] in users, "the API user is not a user of the auth manager"
    assert conn["login"] != admins[0], "the failure sensor uses the admin account"
    assert users[conn["login"]].upper() != "ADMIN"
    # its own password, and the admin's given to no service that runs tasks (all read the
    # connection, and their environment)
    raw_conn = raw["services"][WORKER]["environment"]["AIRFLOW_CONN_AIRFLOW_API_DEFAULT"]
    assert ADMIN_PASSWORD not in variables_used(raw_conn)
    admin_password = dummy_env()[ADMIN_PASSWORD]
    assert conn["password"] != admin_password
    for name, service in raw["services"].items():
        if ADMIN_PASSWORD in variables_used(json.dumps(service)):
            assert name == ONE_SHOT, f"{name} is given the admin's password"
    assert admin_password in services[ONE_SHOT]["environment"].values()
    # the auth manager those users belong to: Airflow's simple one, with no "everyone is admin"
    env = airflow_env(services)
    from airflow.configuration import conf

    assert env.get(
        "AIRFLOW__CORE__AUTH_MANAGER", conf.get_default_value("core", "auth_manager")
    ) == ("airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    assert env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False").lower() == "false"


def _api_hook_calls(services, monkeypatch) -> list[tuple[str, str]]:
    """(method, path) of every REST call of AirflowApiHook's methods, on a fake api-server."""
    from airflow_txn_provider.hooks.airflow_api import AirflowApiHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_AIRFLOW_API_DEFAULT",
        airflow_env(services)["AIRFLOW_CONN_AIRFLOW_API_DEFAULT"],
    )
    calls: list[tuple[str, str]] = []

    def send(method: str, path: str, **_kwargs: Any) -> httpx.Response:
        calls.append((method, path))
        return httpx.Response(200, json={"access_token": "t"} if path == "/auth/token" else {})

    hook = AirflowApiHook()
    monkeypatch.setattr(hook, "_send", send)
    day = datetime(2026, 1, 1, tzinfo=UTC)
    exercised = {
        "clear_task_instances": lambda: (
            hook.clear_task_instances("d", ["t"], run_id="r", note="n"),
            hook.clear_task_instances("d", ["t"], logical_dates=(day, day)),
        ),
        "task_instances": lambda: hook.task_instances("d", "r"),
        "set_run_note": lambda: hook.set_run_note("d", "r", "n"),
        "finished_runs_through": lambda: hook.finished_runs_through("d", day, limit=5),
        "delete_dag_run": lambda: hook.delete_dag_run("d", "r"),
        # a rewind's restart of the runs (airflow_txn_provider.rewind.restart_runs)
        "task_ids": lambda: hook.task_ids("d"),
        "unfinished_runs_from": lambda: hook.unfinished_runs_from("d", day),
        "set_run_state": lambda: hook.set_run_state("d", "r", "failed"),
        "set_paused": lambda: hook.set_paused("d", True),
        # the waker's (and a claim's) creation of a txid's run
        "create_txid_run": lambda: hook.create_txid_run("d", 1),
        # the waker's look at a txid's run and at who holds its logical date (run_keeper)
        "dag_run": lambda: hook.dag_run("d", "r"),
        "run_at": lambda: hook.run_at("d", day),
    }
    for call in exercised.values():
        call()
    # every method of the hook that calls the API is exercised here
    callers = {
        name
        for name, member in vars(AirflowApiHook).items()
        if inspect.isfunction(member)
        and name not in ("request", "_authorized")
        and re.search(r"self\.(request|_authorized)\(", inspect.getsource(member))
    }
    assert callers <= set(exercised), f"not exercised: {callers - set(exercised)}"
    return [call for call in calls if call[1] != "/auth/token"]


def _dag_permissions(method: str, path: str) -> set[tuple[str, Any]]:
    """(method, DagAccessEntity) that the api-server's route for ``method path`` checks."""
    from airflow.api_fastapi.core_api.routes.public import public_router
    from fastapi.routing import APIRoute

    route = next(
        r
        for r in public_router.routes
        if isinstance(r, APIRoute) and method in r.methods and r.path_regex.fullmatch(path)
    )
    checks: set[tuple[str, Any]] = set()

    def walk(dependant: Any) -> None:
        for dep in dependant.dependencies:
            qualname = getattr(dep.call, "__qualname__", "")
            if qualname.startswith("requires_access"):
                assert qualname == "requires_access_dag.<locals>.inner", f"{path}: {qualname}"
                found = inspect.getclosurevars(dep.call).nonlocals
                checks.add((found["method"], found["access_entity"]))
            walk(dep)

    walk(route.dependant)
    assert checks, f"{method} {path}: no DAG permission found"
    return checks


def test_api_users_role_is_the_least_that_works(services, monkeypatch):
    """The role of the failure sensor's user is enough for every call its hook makes, as the
    api-server's routes check them, and no lower role of the simple auth manager is."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import (
        SimpleAuthManager,
        SimpleAuthManagerRole,
    )
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    needed = set()
    for method, path in _api_hook_calls(services, monkeypatch):
        needed |= _dag_permissions(method, path)
    # what the hook does: clear task instances, edit (the note, the state) and delete runs, list
    # them, pause a DAG (a rewind)
    assert {m for m, _ in needed} >= {"GET", "PUT", "DELETE"}

    manager = SimpleAuthManager()
    login = connection(services, "airflow_api_default")["login"]

    def allowed(role: str) -> bool:
        user = SimpleAuthManagerUser(username=login, role=role)
        return all(
            manager.is_authorized_dag(
                method=method, access_entity=entity, details=DagDetails(id="d"), user=user
            )
            for method, entity in needed
        )

    role = SimpleAuthManagerRole[simple_auth_users(airflow_env(services))[login].upper()]
    assert role != SimpleAuthManagerRole.ADMIN
    assert allowed(role.name), f"role {role.name} cannot make the failure sensor's calls"
    lower = [r for r in SimpleAuthManagerRole if r.order < role.order]
    assert lower and not any(allowed(r.name) for r in lower), f"{role.name} is more than needed"


def _init_password_script(services: dict[str, dict[str, Any]]) -> str:
    script = command(services[ONE_SHOT])[2]
    found = re.search(r"^python - <<'EOF'\n(.*?)^EOF$", script, re.M | re.S)
    assert found, "airflow-init writes the password file with an inline Python script"
    return found[1]


def _run_init_passwords(services, passwords: Path) -> subprocess.CompletedProcess[str]:
    env = {k: str(v) for k, v in services[ONE_SHOT]["environment"].items()}
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(passwords)
    env["PATH"] = os.environ.get("PATH", "")
    result = subprocess.run(
        [sys.executable, "-c", _init_password_script(services)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result


def test_init_gives_the_admin_and_the_api_user_their_passwords(
    services, raw, tmp_path, monkeypatch
):
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    passwords = tmp_path / "passwords.json"
    result = _run_init_passwords(services, passwords)
    assert result.returncode == 0, result.stderr
    assert passwords.stat().st_mode & 0o777 == 0o600
    conn = connection(services, "airflow_api_default")
    users = simple_auth_users(airflow_env(services))
    (admin,) = [user for user, role in users.items() if role == "admin"]
    assert json.loads(passwords.read_text()) == {
        admin: services[ONE_SHOT]["environment"][ADMIN_PASSWORD],
        conn["login"]: conn["password"],
    }
    # as the api-server's simple auth manager reads them
    monkeypatch.setenv(
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
        airflow_env(services)["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"],
    )
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    roles = {user.username: user.role for user in SimpleAuthManager.get_users()}
    assert roles == {admin: "admin", conn["login"]: "user"}
    assert set(SimpleAuthManager.get_passwords()) == set(roles)

    # it refuses an API user that is the admin, or has the admin's password
    for override, reason in (
        ({"AIRFLOW_API_USER": admin}, "must be its own user with the role 'user'"),
        ({"AIRFLOW_API_PASSWORD": dummy_env()[ADMIN_PASSWORD]}, "must differ from"),
    ):
        bad = dict(_interpolate_all(raw, {**dummy_env(), **override})["services"])
        refused = tmp_path / f"refused-{len(reason)}.json"
        result = _run_init_passwords(bad, refused)
        assert result.returncode != 0 and reason in result.stderr, (override, result.stderr)
        assert not refused.exists(), "no password file is written"


def test_spark_ui_forwarder_forwards(services):
    """The spark-ui service's inline forwarder runs, and carries an HTTP exchange both ways."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"spark ui at {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=upstream.serve_forever, daemon=True).start()
    listen = free_port()
    script = command(services[SPARK_UI])[2]
    route = f"127.0.0.1:{listen}=127.0.0.1:{upstream.server_address[1]}"
    proc = subprocess.Popen([sys.executable, "-c", script, route], stderr=subprocess.PIPE)
    try:
        deadline = datetime.now().timestamp() + 20
        while True:
            try:
                got = httpx.get(f"http://127.0.0.1:{listen}/jobs/", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert datetime.now().timestamp() < deadline, "the forwarder never listened"
                time.sleep(0.05)
        assert got.status_code == 200 and got.text == "spark ui at /jobs/"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        upstream.shutdown()


# -- volumes -----------------------------------------------------------------------------------


def test_volumes_are_declared_and_bind_sources_exist(compose, services):
    declared = set(compose["volumes"])
    used = set()
    for name, service in services.items():
        for source in volume_mounts(service).values():
            if source.startswith((".", "/")):
                assert (DOCKER / source).resolve().exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"
    init = volume_mounts(services["postgres"])["/docker-entrypoint-initdb.d/10-txn-databases.sh"]
    assert (DOCKER / init).resolve() == POSTGRES_INIT


def test_data_and_logs_are_shared(services):
    data_paths = set()
    for name in DATA_READERS:
        mounts = {v: k for k, v in volume_mounts(services[name]).items()}
        assert DATA_VOLUME in mounts, f"{name} does not see the sources' data"
        data_paths.add(mounts[DATA_VOLUME])
    assert data_paths == {"/data"}, "the data must be at the same path everywhere"
    # The examples' landing folder is written by Airflow tasks and read by Spark: on /data.
    examples = PurePosixPath(airflow_env(services)["TXN_EXAMPLES_DATA"])
    assert examples.is_relative_to("/data")

    home = dockerfile_env()["AIRFLOW_HOME"]
    for name in (ONE_SHOT, *AIRFLOW_SERVICES):
        assert volume_mounts(services[name]).get(f"{home}/logs") == "airflow-logs", name
    passwords = PurePosixPath(
        airflow_env(services)["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    )
    for name in (ONE_SHOT, "airflow-api-server"):
        assert volume_mounts(services[name]).get(str(passwords.parent)) == "airflow-auth", name


# -- variables ---------------------------------------------------------------------------------


def test_env_example_lists_every_variable():
    required, optional = env_example()
    used = variables_used(COMPOSE.read_text())
    for name, defaults in used.items():
        if None in defaults:
            assert name in required, f"{name} is required: add `{name}=` to .env.example"
            assert len(defaults) == 1, (
                f"{name} is required in one place and has a default in another"
            )
        else:
            assert name in optional, f"{name} is not in .env.example"
            assert defaults == {optional[name]}, f"{name}: defaults {defaults} vs .env.example"
    assert set(required) | set(optional) <= set(used), "stale variables in .env.example"


def test_postgres_init_reads_what_postgres_is_given(services):
    script = POSTGRES_INIT.read_text()
    read = set(re.findall(r"\$\{([A-Z_]+)", script))
    given = set(services["postgres"]["environment"]) | {"POSTGRES_DB"}  # the image sets it
    assert read <= given, f"postgres-init.sh reads {read - given}, never set"
    assert POSTGRES_INIT.stat().st_mode & 0o111, "the image sources non-executable scripts"


# -- the Dockerfile ----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined."""
    instructions, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, args = current.strip().partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
        current = ""
    return instructions


def dockerfile_env() -> dict[str, str]:
    env = {}
    for keyword, args in dockerfile():
        if keyword == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def dockerfile_copies() -> list[tuple[list[str], str]]:
    copies = []
    for keyword, args in dockerfile():
        if keyword == "COPY":
            parts = [p for p in shlex.split(args) if not p.startswith("--")]
            copies.append((parts[:-1], parts[-1]))
    return copies


def run_steps() -> list[str]:
    """Every shell command of every RUN, in order."""
    return [
        step.strip()
        for keyword, args in dockerfile()
        if keyword == "RUN"
        for step in args.split("&&")
    ]


def makefile_pyspark_version() -> str:
    m = re.search(r"^PYSPARK_VERSION\s*:?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert m, "the Makefile pins PYSPARK_VERSION"
    return m[1]


def test_dockerfile_base_image_is_debian_12_with_the_projects_python():
    (base,) = [args for keyword, args in dockerfile() if keyword == "FROM"]
    # the base is a build argument (the stack test builds on a local stand-in) whose default is
    # the official image
    (arg,) = [args for keyword, args in dockerfile() if keyword == "ARG" and "PYTHON_IMAGE" in args]
    assert base == "${PYTHON_IMAGE}", base
    base = arg.partition("=")[2]
    m = re.fullmatch(r"python:(\d+\.\d+)-slim-bookworm", base)
    assert m, base
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', pyproject, re.M)[1]
    assert SpecifierSet(requires).contains(m[1]), f"{base} vs requires-python {requires}"
    # SPARK_HOME names the Python version: pyspark's folder in the image's virtualenv
    env = dockerfile_env()
    assert env["SPARK_HOME"] == f"{env['VIRTUAL_ENV']}/lib/python{m[1]}/site-packages/pyspark"


def test_dockerfile_installs_java_and_the_jdbc_driver():
    packages = set()
    for step in run_steps():
        words = step.split()
        if words[:2] == ["apt-get", "install"]:
            packages |= {w for w in words[2:] if not w.startswith("-")}
    assert {"openjdk-17-jre-headless", "libpostgresql-jdbc-java", "procps", "tini"} <= packages


def test_dockerfile_installs_the_lock_then_the_makefiles_pyspark():
    version = makefile_pyspark_version()
    lock = (ROOT / "requirements.lock").read_text()
    assert re.search(rf"^pyspark=={re.escape(version)}\b", lock, re.M), "lock and Makefile agree"
    steps = run_steps()
    lock_dest = next(dest for srcs, dest in dockerfile_copies() if srcs == ["requirements.lock"])
    lock_install = steps.index(f"pip install -r {lock_dest}")
    reinstall = steps.index(f"pip install --no-deps --force-reinstall pyspark=={version}")
    assert reinstall > lock_install, "pyspark is reinstalled after pyspark-client overwrote it"
    project = next(i for i, s in enumerate(steps) if s.startswith("pip install --no-deps /"))
    assert project > reinstall
    # the build's own check that pyspark's Python and jars agree names the same version
    text = DOCKERFILE.read_text()
    checked = re.findall(r"__version__ != '([^']+)'", text) + re.findall(
        r"spark-core_\*-(.+?)\.jar", text
    )
    assert checked and set(checked) == {version}, checked


def test_dockerfile_copies_dags_and_jobs_where_compose_looks(services):
    copies = {tuple(srcs): dest for srcs, dest in dockerfile_copies()}
    env = airflow_env(services)
    assert copies[("dags",)] == env["AIRFLOW__CORE__DAGS_FOLDER"]
    assert copies[("spark_jobs",)] == env["TXN_SPARK_JOBS"]
    # side by side, as in the repository: DAGs find jobs relative to their own file
    assert Path(copies[("dags",)]).parent == Path(copies[("spark_jobs",)]).parent
    (workdir,) = [args for keyword, args in dockerfile() if keyword == "WORKDIR"]
    assert Path(copies[("spark_jobs",)]).parent == Path(workdir)


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins; a
    pattern that matches a parent folder matches the path)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = re.escape(pattern.strip("/"))
        out = out.replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        return re.compile(out.replace(r"\?", "[^/]"))

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if any(regex(pattern.lstrip("!")).fullmatch(p) for p in prefixes):
            excluded = not negated
    return excluded


def test_dockerfile_copy_sources_exist_in_the_build_context():
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert _dockerignore_excludes(".venv/bin/python", ignore)
    assert _dockerignore_excludes("docker/.env", ignore), "secrets stay out of the image"
    for srcs, _dest in dockerfile_copies():
        for src in srcs:
            path = ROOT / src
            assert path.exists(), f"COPY {src}: not in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for file in files:
                rel = file.relative_to(ROOT).as_posix()
                if "__pycache__" not in rel:
                    assert not _dockerignore_excludes(rel, ignore), f"{rel} is .dockerignored"
    # what `pip install .` needs: pyproject.toml names README.md as the readme
    copied = {src for srcs, _ in dockerfile_copies() for src in srcs}
    assert {"pyproject.toml", "README.md", "airflow_txn_provider"} <= copied


def test_dockerfile_runs_as_a_non_root_user_under_tini():
    users = [args for keyword, args in dockerfile() if keyword == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), "the image must not run as root"
    (entrypoint,) = [json.loads(args) for keyword, args in dockerfile() if keyword == "ENTRYPOINT"]
    assert entrypoint[:2] == ["/usr/bin/tini", "--"]  # where Debian's tini package puts it
    copies = {dest: srcs for srcs, dest in dockerfile_copies()}
    assert (ROOT / copies[entrypoint[2]][0]).stat().st_mode & 0o111, "entrypoint not executable"


# -- Docker's own validation, where its Compose plugin exists ------------------------------------


def test_docker_compose_config_accepts_the_stack(tmp_path):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    # an engine address that cannot exist: `config` must not need one, nor the network
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, env=env, timeout=60
    )
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["?"])[0]
        pytest.skip(f"the docker CLI has no compose plugin ({reason})")
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in dummy_env().items()))
    result = subprocess.run(
        [docker, "compose", "--env-file", str(env_file), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
