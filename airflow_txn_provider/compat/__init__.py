"""Version differences, one small module each: the only place that asks which version runs.

- ``python``: the standard library's additions of Python 3.11 (``StrEnum``, ``UTC``) on 3.10.
- ``airflow``: the task SDK and API names that moved between Airflow 3.1, 3.2 and 3.3.
- ``spark``: the PySpark calls that Spark 3.5 lacks (an Arrow collect, Spark Connect's
  observations, retry policies and session release).

Everything else imports from here instead of testing a version; docs/deployment.md, "Supported
versions", lists the ranges and `make test-matrix` tests them.
"""
