"""The install is consistent: pyspark's Python files and its jars are the same version.

apache-airflow-providers-apache-spark pulls ``pyspark-client``, which overwrites an installed
pyspark's Python files without pip noticing; the Makefile reinstalls pyspark last.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyspark


def test_pyspark_python_matches_its_jars():
    jars = Path(pyspark.__file__).parent / "jars"
    core = [p.name for p in jars.glob("spark-core_*.jar")]
    assert len(core) == 1, f"expected one spark-core jar in {jars}, found {core}"
    jar_version = re.match(r"spark-core_[\d.]+-(.+)\.jar", core[0]).group(1)
    assert pyspark.__version__ == jar_version, (
        f"pyspark Python is {pyspark.__version__} but its jars are {jar_version}: "
        "pyspark-client overwrote pyspark; run `make install` (it reinstalls pyspark last)"
    )
