"""Applying one txid to a set of outputs (a live commit's and a fill's), and a rewind's inverse.

Inside the caller's Postgres transaction, :func:`apply_txid` applies a txid to each state by its
kind's rule, from the rows staged under an attempt (their count must equal the one recorded or
computed: a lost UNLOGGED staging table fails instead of applying part), and to each lake sink by
one table commit that records the txid and attempt, never twice
(:func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit`); it patches the txid's
recorded output with each sink's commit and spec. After that transaction, :func:`clean_up`
deletes the staged files no table references. A rewind puts states back from their undo records
(:func:`rewind_states`) and lake tables to the kept txid's version (:func:`rewind_tables`).
A new kind of output is applied and undone here, in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from airflow_txn_provider.log.expectations import take_back_quarantined
from airflow_txn_provider.log.models import TRANSACTIONS
from airflow_txn_provider.log.rows import TxidRows
from airflow_txn_provider.rules.vocabulary import LAKE_OUTPUT_PREFIX, SinkAction
from airflow_txn_provider.sinks.base import SINK_SPEC, StagedFiles, sink_from_spec
from airflow_txn_provider.state import load_states

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from airflow_txn_provider.sinks.base import LakeSink, LakeTable
    from airflow_txn_provider.state import MapState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outputs:
    """The outputs a txid is applied to: states, and lake sinks with their tables open."""

    pipeline: str
    states: Sequence[MapState] = ()
    sinks: Sequence[LakeSink] = ()
    tables: Mapping[LakeSink, LakeTable] = field(default_factory=dict)

    @classmethod
    def open(
        cls, pipeline: str, states: Sequence[MapState], sinks: Sequence[LakeSink], log_url: str
    ) -> Outputs:
        return cls(pipeline, list(states), list(sinks), {s: s.open(log_url) for s in sinks})

    def only(self, names: set[str]) -> Outputs:
        """Only the outputs named in ``names`` (their tables already open)."""
        return Outputs(
            self.pipeline,
            [s for s in self.states if s.name in names],
            [s for s in self.sinks if s.name in names],
            self.tables,
        )


@dataclass(frozen=True)
class SinkWrite:
    """One txid's files given to a lake sink, for :func:`clean_up` once the transaction commits.

    ``kept``: the table references ``files`` (committed now, or by this attempt's earlier try),
    so every other staged directory of the txid goes. Otherwise the table held the txid from a
    fill's earlier try, whose files are not known here: ``files`` go if the fill computed them
    (``computed``), and the live processing's are left alone.
    """

    sink: LakeSink
    txid: int
    files: StagedFiles | None
    kept: bool = True
    computed: bool = False


@dataclass
class AppliedTxid:
    """What :func:`apply_txid` did: per state ``{"staged_rows", "keys"}``, per lake sink (by
    its output key) the table commit; and the files to clean up after the transaction."""

    details: dict[str, Any] = field(default_factory=dict)
    writes: list[SinkWrite] = field(default_factory=list)


def apply_txid(
    conn: Connection,
    outputs: Outputs,
    txid: int,
    attempt: int,
    *,
    rows: Mapping[str, int | None],
    files: Mapping[str, StagedFiles | None],
    staged_attempt: int | None = None,
    rewound_through: int = 0,
    committed_through: int = 0,
    fill: bool = False,
    computed: bool = False,
) -> AppliedTxid:
    """Apply ``(txid, attempt)`` to ``outputs`` in ``conn``'s transaction (see the module).

    :param rows: per state name, the staged rows to expect (``None``: not checked).
    :param files: per sink name, the staged files to commit (``None``: none).
    :param staged_attempt: the attempt the states' rows are staged under (a fill stages its own
        under one no live attempt has); ``attempt`` by default.
    :param rewound_through: the newest txid a rewind failed; ``committed_through``: the newest a
        table may hold already (a fill applies committed txids): the sink rule's inputs.
    :param fill: the caller is a fill: a table may hold the txid from its earlier try, with
        files of that try (a live commit's earlier try staged the same files as this one).
    :param computed: the fill computed ``files``, else the live processing staged them.
    """
    pipeline = outputs.pipeline
    applied = AppliedTxid()
    for state in outputs.states:
        done = state.apply(
            conn,
            txid,
            attempt if staged_attempt is None else staged_attempt,
            expected_rows=rows.get(state.name),
        )
        applied.details[state.name] = {"staged_rows": done.staged_rows, "keys": done.keys}
    patch = {}
    for sink in outputs.sinks:
        given = files.get(sink.name)
        commit = sink.commit(
            outputs.tables[sink],
            pipeline,
            txid,
            attempt,
            given,
            rewound_through=rewound_through,
            committed_through=committed_through,
        )
        held = commit.action == SinkAction.ALREADY_IN_TABLE
        applied.details[sink.output_key] = commit.to_json()
        applied.writes.append(
            SinkWrite(sink, txid, given, kept=not (held and fill), computed=computed)
        )
        # files the table does not reference are not recorded (they go after the transaction)
        recorded = given.to_json() if given is not None and not (held and computed) else {}
        patch[sink.output_key] = {**recorded, "commit": commit.to_json(), SINK_SPEC: sink.to_spec()}
    if patch:
        TxidRows(conn, pipeline, txid).patch_output(attempt, patch)
    return applied


def clean_up(pipeline: str, writes: Sequence[SinkWrite]) -> None:
    """Delete the staged files no table references (see :class:`SinkWrite`), after the
    transaction that applied them committed. Best effort: a leftover is garbage, never data."""
    for write in writes:
        try:
            if write.kept:
                write.sink.cleanup(pipeline, write.txid, write.files)
            elif write.computed and write.files is not None:
                write.files.discard()
        except Exception as err:  # garbage left behind is not data lost: never fail a commit
            log.warning(
                "pipeline=%s txid=%s sink=%s cleanup: %s",
                pipeline,
                write.txid,
                write.sink.name,
                err,
            )


def rewind_states(conn: Connection, pipeline: str, to_txid: int) -> dict[str, dict[str, int]]:
    """Put every state of ``pipeline`` back as it was after ``to_txid - 1``'s commit, from the
    undo records each commit wrote, and take back the rows its audits quarantined since (in
    ``conn``'s transaction); per state the keys restored and removed, and the rows taken back."""
    done = {
        name: state.rewind(conn, to_txid)
        for name, state in sorted(load_states(conn, pipeline).items())
    }
    for name, rows in take_back_quarantined(conn, pipeline, to_txid).items():
        done.setdefault(name, {})["quarantined_rows_taken_back"] = rows
    return done


def rewind_tables(conn: Connection, pipeline: str, keep: int, log_url: str) -> dict[str, str]:
    """Take every lake table a txid after ``keep`` wrote back to ``keep``, each opened from the
    spec its commits recorded; returns what happened per sink. A table already there is left
    alone; one that cannot be opened or rolled back now is not (never raises: the next commit
    into it rolls it back, :func:`~airflow_txn_provider.rules.coordinator.plan_sink_commit`)."""
    done: dict[str, str] = {}
    for name, spec in sorted(_lake_outputs_after(conn, pipeline, keep).items()):
        later = f"rolled back by txid {keep + 1}'s commit"
        if spec is None:  # committed by a version that did not record the sink's spec
            done[name] = f"not opened (its spec is not recorded): {later}"
            continue
        try:
            version = sink_from_spec(spec).open(log_url).rewind(pipeline, keep)
        except Exception as err:  # the log's rewind stands; the next commit does this
            log.warning("pipeline=%s: lake sink %s not rewound now: %s", pipeline, name, err)
            done[name] = f"not rolled back now ({type(err).__name__}: {err}): {later}"
            continue
        done[name] = (
            f"at txid {keep} already"
            if version is None
            else f"rolled back to txid {keep} (version {version})"
        )
        log.warning("pipeline=%s: lake sink %s %s", pipeline, name, done[name])
    return done


def _lake_outputs_after(conn: Connection, pipeline: str, txid: int) -> dict[str, Any]:
    """The lake sinks the txids after ``txid`` wrote (their current attempts' outputs), each
    with its recorded spec (``None``: not recorded)."""
    outputs = conn.execute(
        select(TRANSACTIONS.c.output).where(
            TRANSACTIONS.c.pipeline == pipeline, TRANSACTIONS.c.txid > txid
        )
    ).scalars()
    sinks: dict[str, Any] = {}
    for output in outputs:
        for key, value in (output or {}).items():
            if key.startswith(LAKE_OUTPUT_PREFIX):
                name = key[len(LAKE_OUTPUT_PREFIX) :]
                spec = value.get(SINK_SPEC) if isinstance(value, Mapping) else None
                sinks[name] = sinks.get(name) or spec
    return sinks


__all__ = [
    "AppliedTxid",
    "Outputs",
    "SinkWrite",
    "apply_txid",
    "clean_up",
    "rewind_states",
    "rewind_tables",
]
