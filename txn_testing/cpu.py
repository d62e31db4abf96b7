"""CPU seconds by process group of a deployment the benchmarks start under themselves.

A process that exits is counted by the one that reaped it (its ``children_*`` times): Postgres
backends by their postmaster, and a task's supervisor and task process, which end with the task,
by the executor process that started them, whose reaped children count as task processes. A
process Airflow did not title takes the group of its nearest titled ancestor; a Postgres process
the group of its cluster (by the postmaster it descends from, when named).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import psutil

SCHEDULER = "Airflow scheduler (and its executor)"
TRIGGERER = "Airflow triggerer"
API_SERVER = "Airflow api-server"
DAG_PROCESSOR = "Airflow dag-processor"
TASKS = "Airflow task processes (supervisor + task)"
AIRFLOW_GROUPS = (SCHEDULER, TRIGGERER, API_SERVER, DAG_PROCESSOR, TASKS)
AIRFLOW = "Airflow, all of it"
SPARK = "Spark (JVM)"
POSTGRES = "Postgres"
DRIVER = "driver (this process)"

# Process titles Airflow sets (setproctitle) or the command lines it starts, by group.
_TITLES = (
    (("airflow worker --", "airflow supervisor:", "airflow task supervisor"), TASKS),
    (("airflow executor", "LocalExecutor", "airflow scheduler", "serve-logs"), SCHEDULER),
    (("airflow triggerer",), TRIGGERER),
    (("api_server", "api-server", "uvicorn", "gunicorn"), API_SERVER),
    (("dag-processor", "dag_processor", "dag processor"), DAG_PROCESSOR),
)


def airflow_group(cmdline: str) -> str | None:
    for titles, group in _TITLES:
        if any(t in cmdline for t in titles):
            return group
    return None


def postmaster_pid(datadir: object) -> int:
    """The postmaster of the Postgres cluster in ``datadir`` (``pg_ctl`` starts it detached, so
    it is not a child of the process that started it)."""
    from pathlib import Path

    return int((Path(str(datadir)) / "postmaster.pid").read_text().split()[0])


def cpu_by_group(postmasters: Mapping[int, str] | None = None) -> Counter[str]:
    """CPU seconds used so far by this process and every process under it, by group, and by the
    Postgres clusters ``postmasters`` names (``{postmaster pid: group}``, e.g. the metadata
    database's and the log's): each postmaster with its backends, dead ones included."""
    me = psutil.Process()
    used: Counter[str] = Counter()
    groups: dict[int, str] = {}
    for proc in [me, *me.children(recursive=True)]:  # parents before their children
        try:
            times, name = proc.cpu_times(), proc.name()
            cmdline = " ".join(proc.cmdline())
            parent = proc.ppid()
        except psutil.Error:  # gone meanwhile: its parent counts it
            continue
        if proc.pid == me.pid:
            group = DRIVER
        elif name == "java":
            group = SPARK
        elif name.startswith("postgres"):
            group = POSTGRES
        else:
            group = airflow_group(cmdline) or groups.get(parent, SCHEDULER)
        groups[proc.pid] = group
        own = times.user + times.system
        reaped = times.children_user + times.children_system
        if group == SCHEDULER and ("executor" in cmdline or "LocalExecutor" in cmdline):
            used[group] += own
            used[TASKS] += reaped  # the supervisors and tasks it started, once they ended
        else:
            used[group] += own + reaped
    for pid, group in (postmasters or {}).items():
        try:
            postmaster = psutil.Process(pid)
            tree = [postmaster, *postmaster.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            used[group] += times.user + times.system + times.children_user + times.children_system
    used[AIRFLOW] = sum(used[g] for g in AIRFLOW_GROUPS)
    return used


def cpu_since(
    before: Counter[str], postmasters: Mapping[int, str] | None = None
) -> dict[str, float]:
    after = cpu_by_group(postmasters)
    return {group: after[group] - before.get(group, 0.0) for group in after}


__all__ = [
    "AIRFLOW",
    "AIRFLOW_GROUPS",
    "API_SERVER",
    "DAG_PROCESSOR",
    "DRIVER",
    "POSTGRES",
    "SCHEDULER",
    "SPARK",
    "TASKS",
    "TRIGGERER",
    "airflow_group",
    "cpu_by_group",
    "cpu_since",
    "postmaster_pid",
]


def pin(pid: int, cpus: set[int]) -> int:
    """Pin process ``pid`` and every process under it, each of their threads, to ``cpus``
    (Linux affinity is per thread; threads and processes they start later inherit it), as
    ``taskset -a -p`` would for each. Returns how many threads were pinned."""
    import os

    root = psutil.Process(pid)
    pinned = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            for thread in proc.threads():
                os.sched_setaffinity(thread.id, cpus)
                pinned += 1
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue  # ended meanwhile
    return pinned


def spark_jvms() -> list[int]:
    """The Java processes under this one (a classic PySpark session's JVM, a Connect server)."""
    me = psutil.Process()
    return [p.pid for p in me.children(recursive=True) if "java" in (p.name() or "")]
