"""`make test-matrix`: the provider on each supported Python x Airflow x PySpark cell.

Each cell gets an environment of its own under ``var/matrix/<cell>/`` built by uv: the project's
dependencies and extras resolved for that Python with the cell's Airflow and PySpark lines
(``requirements.txt`` beside it, kept until pyproject.toml or the cell changes; uv's cache makes a
rebuild take seconds). In each it runs the checks below and prints a table of cells x checks.

The default cell is the lock (``.venv``, ``make install``); the others are the corners of the
declared ranges (pyproject.toml): the oldest and newest Airflow minor x PySpark 3.5 and 4.3 x
Python 3.10 and 3.13, where the pair exists (PySpark 4.3 needs Python 3.11 or later: its cells
run on 3.13, the 3.5 cells on 3.10). docs/deployment.md, "Supported versions", lists them.

    python scripts/test_matrix.py                  # every cell, every check
    python scripts/test_matrix.py --cells oldest --checks unit,spark-submit
    python scripts/test_matrix.py --quick          # CI's slice: the oldest cell's unit tests of
                                                   # what differs, one spark-submit txid
    python scripts/test_matrix.py --quick --build-only  # its environment only (CI: beside tests)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "var" / "matrix"
EXTRAS = ("celery", "delta", "iceberg", "kafka", "statsd", "openlineage", "dev")
UV_VERSION = "0.13.9"  # the Makefile's: tests/unit/test_wheel.py builds the wheel with it


@dataclass(frozen=True)
class Cell:
    name: str
    python: str
    airflow: str
    pyspark: str
    lock: bool = False

    def constraints(self) -> list[str]:
        """The cell's lines, as requirements beside the project's own ranges."""
        major = int(self.pyspark.split(".")[0])
        return [
            f"apache-airflow=={self.airflow}.*",
            f"pyspark=={self.pyspark}.*",
            # 6.x depends on pyspark-client>=4.0, whose files overwrite pyspark's: PySpark 3.5
            # takes the Spark provider's 5.x line (docs/deployment.md)
            "apache-airflow-providers-apache-spark<6" if major < 4 else "",
        ]

    @property
    def label(self) -> str:
        return f"Python {self.python} · Airflow {self.airflow} · PySpark {self.pyspark}"


CELLS = (
    Cell("lock", "3.11", "3.3", "4.3", lock=True),
    Cell("oldest", "3.10", "3.1", "3.5"),
    Cell("airflow-3.3-spark-3.5", "3.10", "3.3", "3.5"),
    Cell("airflow-3.1-spark-4.3", "3.13", "3.1", "4.3"),
    Cell("newest", "3.13", "3.3", "4.3"),
)

# name: (pytest arguments, what it shows). `-m ""`: the scenario-marked slices run here too.
CHECKS: dict[str, tuple[list[str], str]] = {
    "unit": (
        # the docker stack's tests check the image built from the lock: the lock cell's
        [
            "-n",
            "2",
            "tests/unit",
            "tests/test_install.py",
            "--ignore=tests/unit/test_docker_stack.py",
        ],
        "the unit suite, and the installed PySpark's files against its jars",
    ),
    "log": (
        [
            "tests/integration/transactions/test_transaction_log.py",
            "tests/integration/transactions/test_pipeline_transitions.py",
            "tests/integration/log/test_txid_transitions.py",
            "tests/integration/log/test_reads.py",
            "tests/integration/log/test_rows.py",
        ],
        "the log on a real Postgres",
    ),
    "spark-submit": (
        ["-m", "", "tests/integration/project/test_versions.py", "-k", "submit or cell_runs"],
        "a transactional and an opaque txid, and the failure cascade, by the cell's spark-submit "
        "on local[2] and on a standalone master and worker of the cell's Spark",
    ),
    "connect": (
        ["-m", "", "tests/integration/project/test_versions.py", "-k", "connect"],
        "the same on Spark Connect (PySpark 4.0 and later: skipped on 3.5)",
    ),
    "lake": (
        [
            "-m",
            "",
            "tests/integration/sinks/test_lake_tables.py::test_spark_submit_jobs_stage_for_the_sink_too",
        ],
        "an Iceberg sink staged by spark-submit jobs, read as of each txid",
    ),
    "airflow": (
        # spark-submit (PySpark 3.5, a JVM per attempt) may take most of an hour on a loaded machine
        ["-m", "", "--timeout=3600", "tests/integration/on_airflow/test_airflow_e2e.py"],
        "a pipeline on a real Airflow of the cell's version: failures re-queued by the failure "
        "sensors, a poison txid cleared by the UI's REST call, every txid committed in order",
    ),
}
CHECKS["spark-submit-one"] = (
    [
        "-m",
        "",
        "tests/integration/project/test_versions.py::test_a_transactional_txid_commits[submit-local]",
    ],
    "one transactional txid by the cell's spark-submit on local[2] (--quick)",
)
CHECKS["wheel"] = (
    [],  # not pytest: wheel_check
    "the built wheel installed into a fresh environment holding only the cell's Airflow, PySpark "
    "and Spark provider, replacing none of them; example_txn_words commits two txids there "
    "(dag.test)",
)
DEFAULT_CHECKS = ["wheel", "unit", "log", "spark-submit", "connect", "lake", "airflow"]
CHECKS["unit-compat"] = (
    [
        "-n",
        "2",
        "tests/test_install.py",
        "tests/unit/test_house.py",  # imports every module of the package
        "tests/unit/test_supported_versions.py",
        "tests/unit/test_dag_builder.py",
        "tests/unit/test_pipeline.py",
        "tests/unit/test_timetables.py",
        "tests/unit/sensors",
        "tests/unit/test_failure_injection.py",
        "tests/unit/spark/test_connect_sessions.py",
        "tests/unit/utils",
    ],
    "the unit tests of what differs between versions (--quick): every module imported, the DAG "
    "built and serialized, the sensor, Connect's refusal, metrics, credentials, lineage",
)
QUICK = ("oldest", ["unit-compat", "spark-submit-one"])


def say(message: str) -> None:
    print(f"[test-matrix {time.strftime('%H:%M:%S')}] {message}", flush=True)


def find_python(minor: str) -> str:
    """The newest installed CPython ``minor`` (pyenv's versions, then the PATH)."""
    roots = [os.environ.get("PYENV_ROOT", ""), str(Path.home() / ".pyenv")]
    for root in filter(None, roots):
        found = sorted(
            glob.glob(f"{root}/versions/{minor}.*/bin/python{minor}"),
            key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()],
        )
        if found:
            return found[-1]
    on_path = shutil.which(f"python{minor}")
    if on_path:
        return on_path
    raise SystemExit(f"Python {minor} not found: install it (pyenv install {minor}) and rerun")


def uv() -> str:
    tool = ROOT / ".venv" / "bin" / "uv"
    if not tool.exists():
        raise SystemExit("uv not found in .venv: run `make install` first")
    return str(tool)


def run(cmd: list[str], log: Path | None = None, **kw) -> int:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", **kw.pop("env", {})}
    cwd = kw.pop("cwd", ROOT)
    if log is None:
        return subprocess.run(cmd, cwd=cwd, env=env, check=True, **kw).returncode
    with log.open("w") as out:
        return subprocess.run(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, **kw
        ).returncode


def build(cell: Cell) -> Path:
    """The cell's environment's Python, built or reused."""
    if cell.lock:
        run(["make", "-s", "install"])
        return ROOT / ".venv" / "bin" / "python"
    folder = WORK / cell.name
    folder.mkdir(parents=True, exist_ok=True)
    python = find_python(cell.python)
    wanted = "\n".join([*filter(None, cell.constraints()), ""])
    key = hashlib.sha256(
        ((ROOT / "pyproject.toml").read_text() + wanted + python + UV_VERSION).encode()
    ).hexdigest()
    venv = folder / "venv"
    stamp = folder / "built"
    if stamp.exists() and stamp.read_text() == key and (venv / "bin" / "python").exists():
        return venv / "bin" / "python"
    say(f"{cell.name}: building ({cell.label}) with {python}")
    (folder / "cell.in").write_text(wanted)
    extras = [arg for extra in EXTRAS for arg in ("--extra", extra)]
    run(
        [
            uv(),
            "pip",
            "compile",
            "-q",
            "--python",
            python,
            "pyproject.toml",
            *extras,
            "-o",
            str(folder / "requirements.txt"),
            "--constraint",
            str(folder / "cell.in"),
        ]
    )
    pins = (folder / "requirements.txt").read_text()
    shutil.rmtree(venv, ignore_errors=True)
    run([uv(), "venv", "-q", "--python", python, str(venv)])
    target = ["--python", str(venv / "bin" / "python")]
    run([uv(), "pip", "install", "-q", *target, "-r", str(folder / "requirements.txt")])
    # As the Makefile does: pyspark-client (the Spark provider 6.x's) overwrites pyspark's files
    spark = next(
        line.split("==")[1].split()[0] for line in pins.splitlines() if line.startswith("pyspark==")
    )
    run([uv(), "pip", "uninstall", "-q", *target, "pyspark"])
    run([uv(), "pip", "install", "-q", *target, "--no-deps", f"pyspark=={spark}"])
    run([uv(), "pip", "install", "-q", *target, "--no-deps", "-e", ".", f"uv=={UV_VERSION}"])
    stamp.write_text(key)
    return venv / "bin" / "python"


def versions(python: Path) -> dict[str, str]:
    code = (
        "import json, sys, airflow, pyspark, sqlalchemy;"
        "print(json.dumps({'python': sys.version.split()[0], 'airflow': airflow.__version__,"
        "'pyspark': pyspark.__version__, 'sqlalchemy': sqlalchemy.__version__}))"
    )
    out = subprocess.run(
        [str(python), "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def wheel_check(cell: Cell, python: Path) -> dict[str, int]:
    """A user's environment: their Airflow, PySpark and Spark provider first (the cell's
    versions), then the provider's wheel; it must replace none of the three, import, and commit
    txids of an example DAG there (``scripts/example_dag_check.py``)."""
    folder = WORK / cell.name
    folder.mkdir(parents=True, exist_ok=True)  # the lock's cell has no environment here
    started = time.monotonic()
    users = ("apache-airflow", "pyspark", "apache-airflow-providers-apache-spark")
    theirs = subprocess.run(
        [uv(), "pip", "freeze", "--python", str(python)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    pins = [line for line in theirs if line.split("==")[0] in users]
    assert len(pins) == len(users), pins
    log = folder / "wheel.log"
    with tempfile.TemporaryDirectory(prefix="txn-wheel-") as tmp:
        source, dist, venv = Path(tmp) / "source", Path(tmp) / "dist", Path(tmp) / "venv"
        skip = shutil.ignore_patterns(
            ".git", ".venv", "var", "test-artifacts", "__pycache__", "*.egg-info", "build"
        )
        shutil.copytree(ROOT, source, ignore=skip)
        steps = {
            "build": [uv(), "build", "-q", "--wheel", "-o", str(dist), str(source)],
            "venv": [uv(), "venv", "-q", "--python", find_python(cell.python), str(venv)],
            "theirs": [
                uv(),
                "pip",
                "install",
                "-q",
                "--python",
                str(venv / "bin" / "python"),
                *pins,
            ],
        }
        code = 0
        for name, step in steps.items():
            code = code or run(step, log=log.with_suffix(f".{name}.log"))
        if not code:
            wheel = next(dist.glob("*.whl"))
            code = run(
                [uv(), "pip", "install", "--python", str(venv / "bin" / "python"), str(wheel)],
                log=log,
            )
        after = subprocess.run(
            [uv(), "pip", "freeze", "--python", str(venv / "bin" / "python")],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        kept = [line for line in after if line.split("==")[0] in users]
        imports = run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import airflow_txn_provider.operators.txn, airflow_txn_provider.plugins",
            ],
            log=log.with_suffix(".import.log"),
            cwd=tmp,  # not this checkout, whose folder `python -c` would import first
        )
        example = not imports and example_dag_commits(cell, venv / "bin" / "python", Path(tmp), log)
    ok = not code and sorted(kept) == sorted(pins) and not imports and example
    say(f"{cell.name}: wheel: theirs {pins}, after the wheel {kept}")
    return {
        "passed": int(ok),
        "failed": int(not ok),
        "skipped": 0,
        "seconds": round(time.monotonic() - started),
    }


def example_dag_commits(cell: Cell, python: Path, tmp: Path, log: Path) -> bool:
    """``scripts/example_dag_check.py`` in the wheel's environment, on a throwaway Postgres
    (Airflow's metadata and the log) and the Spark the example's default mode asks for: the
    environment's own spark-submit on PySpark 3.5, a Spark Connect server (this checkout's
    PySpark 4.3, which every 4.x cell's client may talk to) from 4.0 on."""
    sys.path.insert(0, str(ROOT))
    from contextlib import ExitStack

    from sqlalchemy import create_engine, text

    from txn_testing.airflow import txn_log_connection_env
    from txn_testing.postgres import EmbeddedPostgres
    from txn_testing.spark import SparkConnectServer

    with ExitStack() as started:
        pg = started.enter_context(EmbeddedPostgres(durable=False))
        spark = {}
        if int(cell.pyspark.split(".")[0]) >= 4:
            server = started.enter_context(SparkConnectServer(workdir=tmp / "connect"))
            spark = {"AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": server.url}
        admin = create_engine(pg.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for name in ("airflow_meta", "txn_log"):
                conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        log_url = pg.url.rsplit("/", 1)[0] + "/txn_log"
        home = tmp / "airflow-home"
        env = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/airflow_meta"
            ),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            **txn_log_connection_env("txn_log_default", log_url),
            **spark,
        }
        code = run(
            [
                str(python),
                str(ROOT / "scripts" / "example_dag_check.py"),
                "--dags",
                str(ROOT / "dags"),
                "--log-url",
                log_url,
                "--txids",
                "2",
            ],
            log=log.with_suffix(".example.log"),
            env=env,
            cwd=tmp,  # not this checkout: the provider comes from the wheel
        )
    last = log.with_suffix(".example.log").read_text().strip().splitlines()[-1:]
    say(f"example DAG in the wheel's environment: {last[0] if last else 'no result'}")
    try:
        result = json.loads(last[0])
    except (IndexError, ValueError):
        return False
    # the provider the DAG ran is the wheel's, in the environment, not this checkout
    return code == 0 and result["ok"] and str(tmp) in result["provider"]


def check(cell: Cell, python: Path, name: str) -> dict[str, int]:
    """Run one check in the cell; its pytest counts (``error``: pytest itself failed)."""
    if name == "wheel":
        return wheel_check(cell, python)
    args, _ = CHECKS[name]
    folder = WORK / cell.name
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / f"{name}.xml"
    report.unlink(missing_ok=True)
    cell_env = {"TXN_MATRIX_CELL": json.dumps({"python": cell.python, "pyspark": cell.pyspark})}
    started = time.monotonic()
    code = run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *args,
        ],
        log=folder / f"{name}.log",
        env=cell_env,
    )
    counts = {"passed": 0, "failed": 0, "skipped": 0, "seconds": round(time.monotonic() - started)}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
            counts[outcome] += 1
    if code not in (0, 5) and not counts["failed"]:
        counts["failed"] = 1  # pytest failed before or around the tests (see the log)
    return counts


def cell_text(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "-"
    if counts["failed"]:
        return f"FAIL {counts['failed']}/{counts['passed'] + counts['failed']}"
    if not counts["passed"]:
        return f"skip ({counts['skipped']})"
    return f"ok {counts['passed']}" + (f" +{counts['skipped']}s" if counts["skipped"] else "")


DOCS = ROOT / "docs" / "deployment.md"
MARKS = ("<!-- matrix results -->", "<!-- /matrix results -->")


def write_docs(results: dict[str, dict]) -> None:
    """The last run of each cell, as a table between the marks of docs/deployment.md."""
    rows = [
        "| cell | Python | Airflow | PySpark | SQLAlchemy | "
        + " | ".join(DEFAULT_CHECKS)
        + " | run |",
        "|---" * (6 + len(DEFAULT_CHECKS)) + "|",
    ]
    for cell in CELLS:
        got = results.get(cell.name)
        if got is None:
            rows.append(
                f"| `{cell.name}` | {cell.python} | {cell.airflow} | {cell.pyspark} | "
                + "not run | " * (1 + len(DEFAULT_CHECKS))
                + " |"
            )
            continue
        v = got["versions"]
        marks = [cell_text(got["checks"].get(c)) for c in DEFAULT_CHECKS]
        rows.append(
            f"| `{cell.name}` | {v['python']} | {v['airflow']} | {v['pyspark']} | "
            f"{v['sqlalchemy']} | " + " | ".join(marks) + f" | {got.get('date', '?')} |"
        )
    table = "\n".join(rows)
    text = DOCS.read_text()
    head, rest = text.split(MARKS[0], 1)
    _, tail = rest.split(MARKS[1], 1)
    DOCS.write_text(f"{head}{MARKS[0]}\n{table}\n{MARKS[1]}{tail}")
    say(f"wrote the table to {DOCS.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", help="comma-separated cell names (default: all)")
    parser.add_argument("--checks", help="comma-separated checks (default: all)")
    parser.add_argument("--quick", action="store_true", help="CI's slice of the oldest cell")
    parser.add_argument(
        "--write-docs", action="store_true", help="put the results in docs/deployment.md"
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the cells' environments, run no check (CI builds beside the suite)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        cells, checks = [c for c in CELLS if c.name == QUICK[0]], list(QUICK[1])
    else:
        by_name = {c.name: c for c in CELLS}
        names = args.cells.split(",") if args.cells else list(by_name)
        unknown = sorted(set(names) - set(by_name))
        if unknown:
            parser.error(f"unknown cells {unknown}: choose from {sorted(by_name)}")
        cells = [by_name[n] for n in names]
        checks = args.checks.split(",") if args.checks else DEFAULT_CHECKS
        if unknown := sorted(set(checks) - set(CHECKS)):
            parser.error(f"unknown checks {unknown}: choose from {sorted(CHECKS)}")
    results: dict[str, dict] = {}
    for cell in cells:
        python = build(cell)
        found = versions(python)
        say(
            f"{cell.name}: Python {found['python']}, Airflow {found['airflow']}, "
            f"PySpark {found['pyspark']}, SQLAlchemy {found['sqlalchemy']}"
        )
        results[cell.name] = {"versions": found, "checks": {}}
        for name in [] if args.build_only else checks:
            say(f"{cell.name}: {name} ...")
            counts = check(cell, python, name)
            results[cell.name]["checks"][name] = counts
            say(
                f"{cell.name}: {name}: {cell_text(counts)} in {counts['seconds']} s "
                f"(log: var/matrix/{cell.name}/{name}.log)"
            )
    if args.build_only:
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    saved = WORK / "results.json"
    merged = json.loads(saved.read_text()) if saved.exists() else {}
    for name, got in results.items():  # a cell's checks run now replace its earlier ones
        merged.setdefault(name, {"checks": {}})
        merged[name]["versions"] = got["versions"]
        merged[name]["checks"].update(got["checks"])
        merged[name]["date"] = time.strftime("%Y-%m-%d")
    saved.write_text(json.dumps(merged, indent=2))
    if args.write_docs:
        write_docs(merged)
    width = max(len(c) for c in checks) + 2
    print()
    print(
        "cell".ljust(24) + "versions".ljust(44) + "".join(c.ljust(max(width, 12)) for c in checks)
    )
    for cell in cells:
        got = results[cell.name]
        v = got["versions"]
        label = f"py {v['python']} · airflow {v['airflow']} · pyspark {v['pyspark']}"
        row = cell.name.ljust(24) + label.ljust(44)
        row += "".join(cell_text(got["checks"].get(c)).ljust(max(width, 12)) for c in checks)
        print(row)
    failed = [
        f"{cell}:{name}"
        for cell, got in results.items()
        for name, counts in got["checks"].items()
        if counts["failed"]
    ]
    print()
    print("FAILED: " + ", ".join(failed) if failed else "every cell green")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
