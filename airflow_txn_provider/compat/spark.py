"""What PySpark 3.5 lacks of the 4.x calls the jobs make: one place.

- ``DataFrame.toArrow`` (4.0): on 3.5, classic sessions collect Arrow record batches themselves.
- Spark Connect: the runner needs 4.0's server-side session release (a failed attempt's session
  is never reused), observations read on the client (one pass per batch) and client retry
  policies; a 3.5 Connect client or server has none of them, so the Connect runner refuses
  PySpark 3.5 (:data:`SUPPORTS_CONNECT`) with a typed error, and spark-submit (local, standalone,
  YARN, Kubernetes) runs the jobs there.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING, Any, cast

from packaging.version import Version

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["DEFAULT_SPARK_MODE", "PYSPARK_VERSION", "SUPPORTS_CONNECT", "to_arrow"]

# The installed distribution's version, read without importing pyspark (over a second): a DAG
# file's parse builds a pipeline, whose default Spark mode depends on it, and imports no Spark.
PYSPARK_VERSION = Version(Version(version("pyspark")).base_version)
SUPPORTS_CONNECT = PYSPARK_VERSION >= Version("4.0")
DEFAULT_SPARK_MODE = "connect" if SUPPORTS_CONNECT else "submit"
"""A pipeline's ``spark`` unless it says: the example DAGs run on PySpark 3.5 too."""


def to_arrow(frame: DataFrame) -> pa.Table:
    """``frame`` collected to the driver as one Arrow table (its schema kept when it is empty)."""
    if hasattr(frame, "toArrow"):
        return frame.toArrow()
    import pyarrow as pa  # PySpark 3.5, a classic session: what its toPandas does underneath
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(frame.schema)
    batches = cast(Any, frame)._collect_as_arrow()  # 3.5's classic DataFrame has it
    return pa.Table.from_batches(batches, schema=schema)
