# make test   : create .venv, install the pinned dependencies, run the suite CI runs
# make test-scenarios: the long end-to-end scenarios CI leaves out (make test-all: both)
# make screenshots: the README's screenshots, retaken by the browser test (docs/screenshots/)
# make demo   : the example DAGs on a real Airflow + Spark Connect + Postgres, all in ./var/demo;
#               prints the UI's URL and login, shows commits; Ctrl-C or `make demo-stop` stops it;
#               a second run continues where the first stopped
# make demo-core: the transaction core alone (no Airflow, no Spark) on a Postgres in ./var/pg
# make bench-core : transaction-core benchmark (prints a table)
# make bench-stage: staging rows/s, the binary COPY path beside the text CSV path it replaced
# make bench-spark: per-txid overhead of spark-submit / Spark Connect / standalone, records/s
# make bench-airflow: commit gap and max_pending=4 vs 1 speedup on a real Airflow
# make bench-peer : this project on Airflow vs Spark Structured Streaming foreachBatch, same data;
#               twice: on every CPU, then every Spark JVM pinned to the same CPUs (--pin-spark)
# make bench-read : where one batch's Spark time goes: this project's read vs plain scans
# make bench-preload: a task process's first Spark Connect call, fresh vs forked from a warm parent
# make bench-begin: a txid's begin in a fresh process after 10, 1 000 and 100 000 source files
# make bench-retention: log table sizes and the page's state read over 10k txids, with/without retention
# make bench-lake : rows/s into a Delta / Iceberg table vs Spark writing the same Parquet directly
# make bench-audit: five expectations audited before each commit vs none (1e5, 1e6 rows/txid)
# make bench-sessions: a txid on a new Spark Connect server session vs on its pipeline's reused one
# make bench-fill: a fill of 1 000 txids of history vs the live pipeline's processing (rows/s), and the
#               live commit latency during the fill (issue 44)
# make bench-pipelines: N pipelines on one Airflow: paused (Airflow's floor) vs idle vs a trickle
#               (CPU-s per second by process group), latency, a burst; N = 20, then N = 100
# make bench-asof: a 1M-key state read as of 10 and 100 txids back vs its current read, a key's
#               history over 1 000 txids (issue 61; BENCH_ARGS: e.g. --quick)
# make chaos : the seeded chaos suite (faults caused for real; both tiers print their tables)
# make chaos-lake: both chaos tiers on lake-sink pipelines (a Delta table, then an Iceberg table)
# make test-matrix: the supported versions' corners (Python x Airflow x PySpark), an environment
#               each built by uv in var/matrix/; prints a table of cells x checks (MATRIX_ARGS:
#               --cells, --checks, --quick)
# make test-stack: docker/compose.yaml run for real in podman containers (images built here), every
#               example committing across hosts, a UI rerun, faults healed (tests/stack/run.py)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYSPARK_VERSION := 4.3.0
UV_VERSION := 0.13.9
UV     := $(VENV)/bin/uv
PYTEST_ARGS ?=

.PHONY: demo demo-stop demo-core install system-deps test test-suite test-scenarios test-all screenshots test-unit test-integration lint chaos chaos-fast chaos-rewind chaos-fill chaos-airflow chaos-lake bench-core bench-undo bench-stage bench-spark bench-airflow bench-peer bench-read bench-preload bench-begin bench-retention bench-audit bench-lake bench-sessions bench-fill bench-pipelines bench-asof test-stack stack-deps test-matrix clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml scripts/system-deps.sh
	bash scripts/system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv installs the lock's exact pins in well under a minute (pip took three): CI's budget
	$(VENV)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) pip install -q --python $(PY) -r requirements.lock
	@# apache-airflow-providers-apache-spark pulls pyspark-client, whose Python files overwrite
	@# pyspark's: reinstall pyspark last so its Python and its jars are the same version
	@# (tests/test_install.py asserts it). Uninstall, then install: `--reinstall` implies
	@# `--refresh`, which builds pyspark's sdist a second time instead of taking the wheel built above.
	$(UV) pip uninstall -q --python $(PY) pyspark
	$(UV) pip install -q --python $(PY) --no-deps pyspark==$(PYSPARK_VERSION)
	$(UV) pip install -q --python $(PY) --no-deps -e .
	@# A build of pyspark's sdist leaves 1.4 GB in uv's cache, and the matrix builds another:
	@# without pruning, clone after clone filled the disk until a CI run's tests hit ENOSPC.
	$(UV) cache prune -q
	touch $(STAMP)

demo: install
	$(PY) scripts/demo.py up

demo-stop:
	$(PY) scripts/demo.py stop

demo-core: install
	$(PY) scripts/demo_core.py

system-deps:
	bash scripts/system-deps.sh

# Lint and types, and the suite on two pytest workers (the machine's cores): the tests that start a
# whole Airflow one after another on one worker, everything else on the other (tests/conftest.py
# groups them). CI runs `make -j2 test`: the type check (~40 s cold) beside the suite, not before
# it. The long end-to-end scenarios (marker `scenario`) run in `make test-scenarios`. pytest exits
# 5 when it collects no test: make treats that as a failure. Native tracebacks: pytest's own
# rendering parses each frame's source, and on CPython 3.11 that crashed a worker (gh-106905) and
# hid the failure (tests/conftest.py reports any failure it cannot render, and the tests a
# crashed worker never ran).
TEST_WORKERS ?= 2
test: lint test-suite

test-suite: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not scenario" --tb=native $(PYTEST_ARGS)

# The long scenarios CI leaves out (each is listed in tests/README.md with what it guards).
test-scenarios: install
	$(PY) -m pytest -m scenario $(PYTEST_ARGS)

# Everything: the suite, then the scenarios.
test-all: test test-scenarios

# The README's screenshots, taken by the browser test on today's UI (docs/screenshots/).
screenshots: install
	TXN_README_SCREENSHOTS=$(CURDIR)/docs/screenshots $(PY) -m pytest tests/integration/on_airflow/test_browser.py $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check airflow_txn_provider txn_testing spark_jobs tests benchmarks dags scripts chaos
	$(VENV)/bin/ruff format --check airflow_txn_provider txn_testing spark_jobs tests benchmarks dags scripts chaos
	$(VENV)/bin/mypy

# The chaos suite: both tiers, each printing a table of faults x recovery x lost x doubled and every
# run's seed (make test runs a fixed-seed subset of both).
# chaos-fast: no Airflow, 200 seeded runs (a worker killed, the log's Postgres crashed, a Postgres
# backend SIGKILLed at seeded points: crash recovery while the server stays up; one- and two-job
# txids), then 20 runs into two Delta tables and 20 into two Iceberg tables (adding a committer
# killed between a table's commit and the log's, and the second table's commit failing after the
# first's, with an opaque source that grows: 240 core-tier runs in all). chaos-airflow: every
# fault on a real Airflow, CHAOS_REPEAT runs each. chaos-lake: the fast tier's lake runs, then
# every fault of the Airflow tier once with a Delta, then an Iceberg table; not part of
# `make chaos`. Every table also counts re-emissions (attempts beyond a txid's first); the
# control runs (fault `none`: 10 fast runs, one per Airflow repeat) fail if they have any.
SEED ?= 2026
CHAOS_REPEAT ?= 2
chaos: chaos-fast chaos-rewind chaos-fill chaos-airflow

chaos-fast: install
	$(PY) chaos/fast.py --runs 200 --seed $(SEED)
	$(PY) chaos/fast.py --runs 10 --seed $(SEED) --faults none
	$(PY) chaos/fast.py --runs 20 --seed $(SEED) --sink delta
	$(PY) chaos/fast.py --runs 20 --seed $(SEED) --sink iceberg

# chaos-rewind: the process running a rewind SIGKILLed at seeded steps (inside the log's
# transaction, at its commit, in the lake tables' step): never a mix, then healed to ground truth.
chaos-rewind: install
	$(PY) chaos/kill_rewind.py --runs 40 --seed $(SEED) --sink delta
	$(PY) chaos/kill_rewind.py --runs 20 --seed $(SEED) --sink iceberg

# chaos-fill: outputs of every kind (map states, a global state, a Delta and an Iceberg table)
# filled from history while the live pipeline commits; the fill's process SIGKILLed and the log's
# Postgres crashed at seeded steps of the fill, and again right after a seeded one of the fill's
# lake table commits, inside a chunk (issues 44, 55).
chaos-fill: install
	$(PY) chaos/fill.py --runs 12 --seed $(SEED)

chaos-airflow: install
	$(PY) chaos/on_airflow.py --seed $(SEED) --repeat $(CHAOS_REPEAT)

chaos-lake: install
	$(PY) chaos/fast.py --runs 20 --seed $(SEED) --sink delta
	$(PY) chaos/fast.py --runs 20 --seed $(SEED) --sink iceberg
	$(PY) chaos/on_airflow.py --seed $(SEED) --sink delta
	$(PY) chaos/on_airflow.py --seed $(SEED) --sink iceberg

bench-core: install
	$(PY) benchmarks/bench_core.py

bench-undo: install
	$(PY) benchmarks/bench_undo.py

bench-stage: install
	$(PY) benchmarks/bench_stage.py

bench-spark: install
	$(PY) benchmarks/bench_spark.py

bench-airflow: install
	$(PY) benchmarks/bench_airflow.py

bench-peer: install
	$(PY) benchmarks/bench_peer.py
	$(PY) benchmarks/bench_peer.py --pin-spark

bench-read: install
	$(PY) benchmarks/bench_batch_read.py

bench-preload: install
	$(PY) benchmarks/bench_preload.py

bench-begin: install
	$(PY) benchmarks/bench_begin.py

bench-retention: install
	$(PY) benchmarks/bench_retention.py

# issue 60: five expectations on 1e5- and 1e6-row txids against none, side by side (goal <= 1.10x)
bench-audit: install
	$(PY) benchmarks/bench_audit.py

bench-lake: install
	$(PY) benchmarks/bench_lake.py

bench-sessions: install
	$(PY) benchmarks/bench_sessions.py

# issue 44: a fill of 1 000 txids of history vs the live pipeline's processing, and the live
# commit latency during the fill; exits non-zero when a goal or the exactness check fails
bench-fill: install
	$(PY) benchmarks/bench_fill.py $(BENCH_ARGS)

# N = 100 with max_pending 2 (the issue allows a smaller window there); each run checks every
# state against ground truth and exits non-zero when a goal is not met (both run regardless).
# The container stack (docker/): podman, runc and debootstrap from Debian, podman-compose from
# PyPI (pinned in tests/stack/requirements.txt), then the test; required of every change to
# docker/, the Dockerfile's inputs or the deployment docs. STACK_ARGS: e.g. --faults kill_scheduler
STACK_ARGS ?=
stack-deps: install
	bash scripts/stack-deps.sh
	$(UV) pip install -q --python $(PY) -r tests/stack/requirements.txt

test-stack: stack-deps
	$(PY) -m tests.stack.run --seed $(SEED) $(STACK_ARGS)

MATRIX_ARGS ?=
test-matrix: install
	$(PY) scripts/test_matrix.py $(MATRIX_ARGS)

bench-pipelines: install
	$(PY) benchmarks/bench_pipelines.py --pipelines 20 --max-pending 4; \
	a=$$?; $(PY) benchmarks/bench_pipelines.py --pipelines 100 --max-pending 2; \
	b=$$?; test $$a -eq 0 -a $$b -eq 0

# issue 61: reads as of 10 and 100 txids back within 3x the current read, a key's history over
# 1 000 txids under 50 ms; exits non-zero when a read is wrong or a goal is missed
bench-asof: install
	$(PY) benchmarks/bench_asof.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis var
