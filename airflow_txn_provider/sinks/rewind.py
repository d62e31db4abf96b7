"""How far a lake table goes back when a pipeline's commits are undone: the rule both formats'
:meth:`~airflow_txn_provider.sinks.base.LakeTable.rewind` follow.

A replaced attempt (an earlier attempt's table commit, then a failure before the log's) is
rewound: only this pipeline's commits above the kept txid are undone, and never past another
writer's commit, whose rows would be lost. Delta and Iceberg list their commits differently;
the choice of where to go back to is the same, so it is here, pure and testable.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_txn_provider.rules.exceptions import LakeTableOutOfSyncError


def first_undone_commit(
    commits: Sequence[tuple[int, str | None, int | None]],
    *,
    pipeline: str,
    keep_txid: int,
    sink: str,
) -> int | None:
    """The oldest of ``pipeline``'s table commits that a rewind to ``keep_txid`` undoes (those of
    a txid above ``keep_txid``): the rewind goes back to the version before it (``None``: no
    commit to undo).

    :param commits: ``(version, pipeline, txid)`` of the table's commits, newest first, back to
        (at least) the pipeline's newest commit of a txid <= ``keep_txid``; ``pipeline`` and
        ``txid`` are ``None`` for another writer's commit.
    Raises :class:`LakeTableOutOfSyncError` when another writer committed after the oldest of
    them: going back would lose its rows."""
    undone: list[int] = []  # positions in ``commits``: versions need not be ordered (Iceberg)
    foreign: list[int] = []
    for i, (_, by, txid) in enumerate(commits):
        if by == pipeline and txid is not None:
            if txid <= keep_txid:
                break
            undone.append(i)
        else:
            foreign.append(i)
    if not undone:
        return None
    oldest = undone[-1]
    newer = [commits[i][0] for i in foreign if i < oldest]
    if newer:
        raise LakeTableOutOfSyncError(
            f"lake sink {sink!r}: another writer committed to the table (versions {newer}) after "
            f"this pipeline's commit of a txid above {keep_txid}; rewinding would lose its rows",
            pipeline=pipeline,
            txid=keep_txid + 1,
        )
    return commits[oldest][0]


def held_versions(
    commits: Sequence[tuple[int, str | None, int | None]], *, pipeline: str
) -> list[tuple[int, int]]:
    """``(txid, version)``, by txid, of the table version that holds each txid >= 1 of
    ``pipeline`` now, from ``(version, pipeline, txid)`` of the table's commits, newest first: a
    txid's newest commit (a replaced attempt's older one is not its), unless a newer commit of
    the pipeline holds an older txid, which means a rewind went back past it, its rows gone.
    """
    newest: dict[int, int] = {}
    ceiling: int | None = None
    for version, by, txid in commits:
        if by != pipeline or txid is None or (ceiling is not None and txid > ceiling):
            continue
        newest.setdefault(txid, version)
        ceiling = txid
    return sorted((t, v) for t, v in newest.items() if t >= 1)


__all__ = ["first_undone_commit", "held_versions"]
