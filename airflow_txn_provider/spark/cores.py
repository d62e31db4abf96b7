"""How many cores the Spark of a session offers, which the window of a pipeline that declares no
``max_pending`` follows (:func:`~airflow_txn_provider.rules.config.fitted_window`; docs/spark.md,
"How many txids process at once")."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

_RANGE_SPLITS = re.compile(r"\bRange \(0, 1, step=1, splits=(\d+)\)")


def spark_cores(spark: SparkSession) -> int:
    """The cores the Spark behind ``spark`` offers: its default parallelism (the tasks a plain
    scan of a small range is split into). A classic session asks its context; a Spark Connect
    client reads it from the plan of ``range(1)`` (no job runs: one analysis request)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    frame: Any = spark.range(1)  # a Spark Connect DataFrame: _explain_string is its own
    plan = frame._explain_string(mode="simple")
    found = _RANGE_SPLITS.search(plan)
    if found is None:
        raise ValueError(f"no split count in the plan of range(1): {plan[:300]!r}")
    return int(found.group(1))


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (not a classic one)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def tell_spark_cores(spark: SparkSession, txlog: TransactionLog, pipeline: str, who: str) -> None:
    """Tell the log the cores the Spark of ``spark`` offers: the window of ``pipeline`` follows
    them (:meth:`~airflow_txn_provider.transactions.declaration.PipelineDeclarations.
    fit_window`). Never raises: the txid is processed, and the next one tells again."""
    try:
        txlog.fit_window(pipeline, spark_cores(spark))
    except Exception as err:
        log.warning("%s: the window was not fitted to Spark (%s: %s)", who, type(err).__name__, err)
