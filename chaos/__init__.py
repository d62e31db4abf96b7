"""Seeded chaos suites: faults injected at random moments into real pipelines, with ground truth.

* :mod:`chaos.fast` — the fast tier, without Airflow: a driver loop plays Airflow's role against a
  real Postgres log, a real Spark Connect server and one real worker process per attempt.
* :mod:`chaos.report` — the result record and the table every tier prints.
"""
