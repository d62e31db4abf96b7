"""Throwaway servers on loopback for the tests, the chaos suite, the benchmarks and the demos:
Postgres (:mod:`.postgres`), Spark Connect and a standalone Spark cluster (:mod:`.spark`), a whole
Airflow deployment (:mod:`.airflow`) and Redis (:mod:`.redis`).

Part of the repository, not of the provider: the wheel does not ship this package. Importable
from the repository root (pytest puts it on ``sys.path``; the scripts of ``chaos/``,
``benchmarks/`` and ``scripts/`` insert it themselves).
"""
