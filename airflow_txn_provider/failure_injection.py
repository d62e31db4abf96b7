"""Failure injection: make chosen attempts of chosen txids fail, to see (and test) a cascade, a
replay and a poison batch on a real deployment.

Off unless the deployment enables it: ``[txn_provider] failure_injection = True`` in Airflow's
configuration (``AIRFLOW__TXN_PROVIDER__FAILURE_INJECTION=True``; ``make demo`` and the tests set
it). Then the processing task reads the Airflow Variable ``txn_inject_failure__<pipeline>``
(:func:`parse_failure_injection` says what it may hold); otherwise it reads nothing at all.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from airflow_txn_provider.rules.exceptions import InjectedFailure

log = logging.getLogger(__name__)

CONFIG_SECTION = "txn_provider"
CONFIG_OPTION = "failure_injection"
ENABLE_ENV = {"AIRFLOW__TXN_PROVIDER__FAILURE_INJECTION": "True"}
"""The environment that turns failure injection on (for a test's or the demo's Airflow)."""
INJECT_FAILURE_VARIABLE = "txn_inject_failure__{pipeline}"
"""Airflow Variable of the failure-injection switch (see :func:`parse_failure_injection`)."""


@dataclass(frozen=True)
class InjectedFailureRule:
    attempts: int | None
    """Attempts to fail (the first N), or ``None`` for every attempt."""
    delay: float = 0.0
    """Seconds to wait before failing, as a job that fails late does."""


def parse_failure_injection(spec: str) -> dict[int, InjectedFailureRule]:
    """Parse the failure-injection switch: ``"3"`` fails txid 3's first attempt, ``"3:2"`` its
    first two, ``"3:*"`` every attempt (a poison batch), ``"3@8"`` fails it after 8 seconds (the
    later txids are in flight by then, and fail with it); several are comma-separated
    (``"3@8,7:*"``)."""
    found: dict[int, InjectedFailureRule] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        rule, _, delay_text = part.partition("@")
        txid_text, _, attempts_text = rule.partition(":")
        try:
            txid = int(txid_text)
            attempts = None if attempts_text.strip() == "*" else int(attempts_text or 1)
            delay = float(delay_text or 0)
        except ValueError:
            raise ValueError(
                f"failure injection {spec!r}: {part!r} is not TXID[:N|:*][@SECONDS]"
            ) from None
        if txid < 1 or (attempts is not None and attempts < 1) or delay < 0:
            raise ValueError(
                f"failure injection {spec!r}: txid and attempts must be >= 1, seconds >= 0"
            )
        found[txid] = InjectedFailureRule(attempts, delay)
    return found


def injected_failure(spec: str | None, txid: int, attempt: int) -> InjectedFailureRule | None:
    """The rule asking ``(txid, attempt)`` to fail, if the switch has one."""
    if not spec:
        return None
    rule = parse_failure_injection(spec).get(txid)
    if rule is None or (rule.attempts is not None and attempt > rule.attempts):
        return None
    return rule


def enabled() -> bool:
    from airflow.configuration import conf

    return conf.getboolean(CONFIG_SECTION, CONFIG_OPTION, fallback=False)


def maybe_inject_failure(pipeline: str, txid: int, attempt: int) -> None:
    """Raise :class:`InjectedFailure` if enabled and the Variable asks ``(txid, attempt)`` to
    fail (after its delay)."""
    if not enabled():
        return
    from airflow.sdk import Variable

    name = INJECT_FAILURE_VARIABLE.format(pipeline=pipeline)
    rule = injected_failure(Variable.get(name, default=None), txid, attempt)
    if rule is None:
        return
    if rule.delay:
        log.warning("failure injected by %s in %.0f s", name, rule.delay)
        time.sleep(rule.delay)
    raise InjectedFailure(
        f"injected failure (Airflow Variable {name})", pipeline=pipeline, txid=txid, attempt=attempt
    )
