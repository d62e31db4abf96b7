"""Liveness, pure: which txids in flight wait for a task of their DAG run, and for how long.

A txid moves only while its run's tasks live: the failure sensor (``watch_failures``) expires a
lost lease and answers a failure, ``commit`` commits a processed txid. A person can end any of
them from the UI (Mark success or Mark failed on a run or a task, Delete). The waker
(:mod:`airflow_txn_provider.triggers.waker`), which outlives every run, asks :func:`needs` on
each poll; a txid that has waited past ``grace`` seconds in the same need (:class:`Overdue`) gets
its run looked at through Airflow's REST API, and the task it waits for is restarted if it ended
(:mod:`airflow_txn_provider.triggers.run_keeper`). The grace lets the live tasks act first: a
failure sensor answers within a poll and a worker's start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_txn_provider.compat.python import StrEnum
from airflow_txn_provider.rules.coordinator import committable
from airflow_txn_provider.rules.fencing import lease_expired
from airflow_txn_provider.rules.records import PipelineView, TxRecord
from airflow_txn_provider.rules.vocabulary import TxStatus

GRACE = 10.0
"""Seconds a txid waits in one need before its run is looked at."""
RECHECK_EVERY = 30.0
"""Seconds between two looks at the run of a txid that still waits (its task was alive)."""


class Need(StrEnum):
    WATCH = "watch"
    """Its current attempt failed, or lost its lease: its failure sensor must answer."""
    COMMIT = "commit"
    """Processed and next to commit: its commit task must commit it."""


def needs(view: PipelineView) -> dict[int, Need]:
    """Each txid in flight that waits for a task of its run, and for which one."""
    found = {
        rec.txid: Need.WATCH
        for rec in view.in_flight
        if rec.status is TxStatus.FAILED or lease_expired(rec, view.now)
    }
    ready = committable(view)
    if ready is not None:
        found[ready.txid] = Need.COMMIT
    return found


@dataclass
class Overdue:
    """Since when each txid has waited in the same need (same attempt, same status), by the
    waker's monotonic clock; :meth:`update` says which are overdue for a look at their run."""

    grace: float = GRACE
    recheck_every: float = RECHECK_EVERY
    _since: dict[tuple[int, int, TxStatus, Need], float] = field(default_factory=dict)
    _looked: dict[tuple[int, int, TxStatus, Need], float] = field(default_factory=dict)

    def update(self, view: PipelineView, now: float) -> list[tuple[TxRecord, Need]]:
        """The txids of ``view`` to look at now: waiting at least ``grace`` seconds, and not
        looked at in the last ``recheck_every``. Each one returned counts as looked at."""
        current: Mapping[int, Need] = needs(view)
        keys = {}
        for txid, need in current.items():
            rec = view.record(txid)
            assert rec is not None  # needs() names txids in flight only
            keys[(txid, rec.attempt, rec.status, need)] = rec
        self._since = {k: self._since.get(k, now) for k in keys}
        self._looked = {k: at for k, at in self._looked.items() if k in keys}
        due = []
        for key, rec in keys.items():
            if now - self._since[key] < self.grace:
                continue
            if now - self._looked.get(key, -float("inf")) < self.recheck_every:
                continue
            self._looked[key] = now
            due.append((rec, key[3]))
        return due


def mark_note(view: PipelineView, txid: int, state: str) -> str:
    """The note of txid ``txid``'s run that a person marked ``state`` (success, failed) in the UI:
    what the log says of the txid, and what the pipeline does about it."""
    head = f"Marked {state} by hand"
    if txid <= view.last_committed:
        return f"{head}; txid {txid} had committed already: nothing changes in the log"
    rec = view.record(txid)
    if rec is None:
        return (
            f"{head} before txid {txid} began: the pipeline restarts this run when the txid is due"
        )
    where = f"{head} while txid {txid} attempt {rec.attempt} was {rec.status.value}"
    if rec.status is TxStatus.PROCESSED:
        return f"{where}: it still commits, in order (the pipeline restarts its commit if needed)"
    # Its job may outlive the mark (Airflow kills it at the task's next heartbeat) and record
    # its output: then the txid commits (a later txid's task commits what is ready, or the
    # pipeline restarts this run's commit task) and its lease never runs out.
    return (
        f"{where}: if its job still records its output, the txid commits in order; if not, the "
        f"pipeline restarts this run's failure sensor once the attempt's lease runs out (within "
        f"{GRACE:.0f} s), and it re-queues the txid and every later one, in order"
    )


__all__ = ["GRACE", "RECHECK_EVERY", "Need", "Overdue", "mark_note", "needs"]
