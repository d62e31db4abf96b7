"""The provider's metrics, through Airflow's own ``Stats`` (StatsD or OpenTelemetry, as the
deployment's ``[metrics]`` section configures; nothing is sent when it configures neither).

Each metric is sent twice, as Airflow sends its own: ``txn.<name>`` tagged
``pipeline=<pipeline>`` (OpenTelemetry, or StatsD with tags), and ``txn.<name>.<pipeline>`` for
plain StatsD, which drops tags. docs/airflow.md lists them. Sending is best effort: a metric that
cannot be sent never fails what it measures.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "txn"

LAST_COMMITTED = "last_committed_txid"
"""Gauge: the txid a commit just made the pipeline's last committed one."""
LAG_PROCESSED = "lag.processed"
"""Gauge: processed txids waiting to commit (newest processed minus last committed), after a
commit."""
LAG_BEGUN = "lag.begun"
"""Gauge: txids begun and not committed, after a commit."""
COMMIT_DURATION = "commit.duration"
"""Timer (ms): one txid's commit, from its Postgres transaction's start to its end."""
STAGED_ROWS = "staged_rows"
"""Counter: state rows a commit applied (the staged rows of its attempt)."""
PROCESSING_DURATION = "processing.duration"
"""Timer (ms): one job's processing of a txid (tagged ``job``; also ``…<pipeline>.<job>``)."""
REEMISSIONS = "reemissions"
"""Counter: txids begun again with a new attempt (a failed one replayed, or one whose lease ran
out re-emitted)."""
RETRIES = "retries"
"""Counter: transient database errors retried (tagged ``kind``: the error's class)."""
LEASE_EXPIRIES = "lease_expiries"
"""Counter: attempts failed because their lease ran out (their process is gone)."""
POISONED = "poisoned"
"""Counter: txids the failure sensor stopped at (``max_attempts`` own failures, or a failed
``fail`` expectation)."""
EXPECTATION_ROWS_CHECKED = "expectation.rows_checked"
"""Counter: rows an expectation checked before a commit (tagged ``expectation``)."""
EXPECTATION_ROWS_FAILED = "expectation.rows_failed"
"""Counter: rows failing an expectation's condition (tagged ``expectation``)."""
EXPECTATION_OUTCOMES = "expectation.outcomes"
"""Counter: an expectation that did not pass (tagged ``expectation`` and ``taken``: ``warned``,
``dropped``, ``failed``, ``not_enough_history``)."""
QUARANTINED_ROWS = "expectation.quarantined_rows"
"""Counter: rows ``drop`` expectations moved to the quarantine as their txids committed."""

ALL = (
    LAST_COMMITTED,
    LAG_PROCESSED,
    LAG_BEGUN,
    COMMIT_DURATION,
    STAGED_ROWS,
    PROCESSING_DURATION,
    REEMISSIONS,
    RETRIES,
    LEASE_EXPIRIES,
    POISONED,
    EXPECTATION_ROWS_CHECKED,
    EXPECTATION_ROWS_FAILED,
    EXPECTATION_OUTCOMES,
    QUARANTINED_ROWS,
)


_initialized_in: int | None = None
"""The process that set Stats up from the ``[metrics]`` configuration (a fork sets it up again)."""
_client: Any = None


def _stats() -> Any:
    """Airflow's ``Stats``, set up once per process from ``[metrics]`` as Airflow's own
    processes do: a commit runs in the triggerer, whose trigger runner has not set it up."""
    global _initialized_in, _client
    if _initialized_in != os.getpid():
        # at call time: it imports Airflow, which the core and a spark-submit driver run without
        from airflow_txn_provider.compat.airflow import stats

        _client = stats()
        _initialized_in = os.getpid()
    return _client


def _send(kind: str, name: str, pipeline: str, value: float, extra: Mapping[str, str]) -> None:
    try:
        # at call time: it imports Airflow, which the core and a spark-submit driver run without
        from airflow_txn_provider.compat.airflow import legacy_stat_name

        stats = _stats()
    except ImportError:  # no Airflow here (the core used on its own)
        return
    except Exception as err:  # a configuration that does not parse: no metrics, no failure
        log.debug("metrics not set up: %s", err)
        return
    try:
        send = getattr(stats, kind)
        send(f"{PREFIX}.{name}", value, tags={"pipeline": pipeline, **extra})
        legacy = ".".join([PREFIX, name, pipeline, *extra.values()])
        send(legacy_stat_name(stats, legacy), value)
    except Exception as err:  # a metric never fails what it measures
        log.debug("metric %s of pipeline %s not sent: %s", name, pipeline, err)


def gauge(name: str, pipeline: str, value: float) -> None:
    _send("gauge", name, pipeline, value, {})


def incr(name: str, pipeline: str, count: int = 1, **tags: str) -> None:
    if count:
        _send("incr", name, pipeline, count, tags)


def timing(name: str, pipeline: str, seconds: float, **tags: str) -> None:
    """``seconds`` sent as milliseconds, as Airflow's timers are."""
    _send("timing", name, pipeline, seconds * 1000.0, tags)


__all__ = ["ALL", "PREFIX", "gauge", "incr", "timing"]
