"""Keeping a processing attempt's lease while its work runs.

Whatever processes a txid wraps its work in a :class:`LeaseKeeper`: a daemon thread renews the
attempt's lease every ``timeout / 5`` seconds, however long the job runs. If the process dies the
renewals stop and, ``timeout`` seconds later, the failure sensor fails the attempt and the txid
replays. A renewal that finds the attempt no longer current calls ``on_lost`` (e.g. to interrupt
its Spark work); one that finds the output recorded stops renewing. A block that ends without an
error hands the lease over for ``handover`` seconds, for the txid's next task to start and renew
it; a process told to stop (SIGTERM: ``on_kill``) abandons it (:meth:`LeaseKeeper.abandon`), so a
later try that resumed the attempt holds it alone, or else the lease runs out.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from airflow_txn_provider.rules.vocabulary import LeaseRenewal

if TYPE_CHECKING:
    from airflow_txn_provider.transactions.transaction_log import TransactionLog

log = logging.getLogger(__name__)

RENEWALS_PER_TIMEOUT = 5
"""A lease is renewed this many times per timeout: one or two late renewals (a slow database, a
busy machine) do not lose it."""


def holder_name(task: str) -> str:
    """Who holds a lease, as a person reading the error needs it: the task, host and pid."""
    return f"{task} (host {socket.gethostname()}, pid {os.getpid()})"


class LeaseKeeper:
    """Renew ``(txid, attempt)``'s lease in the background while the ``with`` block runs.

    :param txlog: the transaction log.
    :param holder: who holds it (see :func:`holder_name`), named in the error when it runs out.
    :param timeout: seconds the lease lasts after each renewal.
    :param on_lost: called once (from the renewing thread) if the attempt is no longer current.
    :param handover: seconds the lease lasts after the block ends without an error (``None``:
        ``timeout``).
    """

    def __init__(
        self,
        txlog: TransactionLog,
        pipeline: str,
        txid: int,
        attempt: int,
        *,
        holder: str,
        timeout: float,
        on_lost: Callable[[], None] | None = None,
        handover: float | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"lease timeout must be > 0 seconds, got {timeout!r}")
        self.txlog = txlog
        self.pipeline = pipeline
        self.txid = txid
        self.attempt = attempt
        self.holder = holder
        self.timeout = timeout
        self.on_lost = on_lost
        self.handover = timeout if handover is None else handover
        self.lost = False
        self.done = False
        self.abandoned = False
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{pipeline}-{txid}-{attempt}", daemon=True
        )

    def renew(self, timeout: float | None = None) -> bool:
        """Renew once now (for ``timeout`` seconds, default the keeper's); False once there is
        nothing left to renew: the attempt is lost (``on_lost`` called) or done."""
        if self.lost or self.done or self.abandoned:
            return False
        found = self.txlog.renew_lease(
            self.pipeline,
            self.txid,
            self.attempt,
            holder=self.holder,
            timeout=self.timeout if timeout is None else timeout,
        )
        if found is LeaseRenewal.RENEWED:
            self.renewals += 1
            return True
        if found is LeaseRenewal.DONE:
            self.done = True
            return False
        self.lost = True
        log.warning(
            "pipeline=%s txid=%s attempt=%s is no longer current (failed or replaced): "
            "stopping its work",
            self.pipeline,
            self.txid,
            self.attempt,
        )
        if self.on_lost is not None:
            try:
                self.on_lost()
            except Exception:  # stopping is best effort: fencing keeps the work from counting
                log.exception("stopping the work of a lost attempt failed")
        return False

    def abandon(self) -> None:
        """Renew no more (this process was told to stop). Only sets a flag: safe in a signal
        handler; the renewing thread ends at its next wake-up."""
        self.abandoned = True

    def _run(self) -> None:
        while not self._stop.wait(self.timeout / RENEWALS_PER_TIMEOUT):
            try:
                if not self.renew():
                    return
            except Exception as err:  # the log is unreachable: keep trying while the work runs
                log.warning(
                    "pipeline=%s txid=%s attempt=%s lease not renewed (%s); retrying",
                    self.pipeline,
                    self.txid,
                    self.attempt,
                    err,
                )

    def __enter__(self) -> LeaseKeeper:
        self.renew()  # take the lease over from the claim's before the work starts
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout)
        if exc_type is None:
            try:
                self.renew(self.handover)
            except Exception as err:  # the last renewal's lease still covers a short gap
                log.warning(
                    "pipeline=%s txid=%s attempt=%s lease not handed over (%s)",
                    self.pipeline,
                    self.txid,
                    self.attempt,
                    err,
                )
