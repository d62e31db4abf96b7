"""Each state kind's rule, one class per kind (Trident's ``NonTransactionalMap``,
``TransactionalMap`` and ``OpaqueMap``).

A rule says two things, both in SQL since a batch applies in one statement
(:meth:`~airflow_txn_provider.state.backing.BackingTable.apply`):

* which bookkeeping columns the state table stores beside the keys and the value;
* how one key's row takes the batch's delta: the ``INSERT … ON CONFLICT DO UPDATE`` parts.

In that statement ``s`` is the stored row, ``EXCLUDED`` the batch's row, and ``:txid`` the txid
being committed. ``⊕`` below is the state's combiner (``sum``, ``max`` or ``min``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from airflow_txn_provider.rules.vocabulary import StateKind

Combine = Callable[[str, str], str]
"""``combine(a, b)``: the SQL of ``a ⊕ b``."""


@dataclass(frozen=True)
class Upsert:
    """The kind's part of the apply statement, after the key columns."""

    columns: str
    """Columns inserted for a new key, after the keys."""
    values: str
    """Their values, from the batch's ``delta``."""
    update: str
    """``SET`` clause for a key already stored."""
    guard: str = ""
    """``WHERE`` of the update: a key it skips was updated by a later txid (see ``apply``)."""


class KindRule:
    kind: ClassVar[StateKind]

    def columns(self, value_type: str) -> list[str]:
        """DDL of the bookkeeping columns (after keys and ``value``)."""
        raise NotImplementedError

    def upsert(self, combine: Combine, combiner: str) -> Upsert:
        raise NotImplementedError


class NonTransactionalRule(KindRule):
    """``value := value ⊕ delta``. Exactly once all the same, because the log's commit applies the
    batch and marks the txid committed in one Postgres transaction."""

    kind = StateKind.NON_TRANSACTIONAL

    def columns(self, value_type: str) -> list[str]:
        return []

    def upsert(self, combine: Combine, combiner: str) -> Upsert:
        return Upsert("value", "delta", f"value = {combine('s.value', 'EXCLUDED.value')}")


class TransactionalRule(KindRule):
    """Stores the txid: skip a key whose stored txid is the current one (the batch applied),
    else ``value := value ⊕ delta``. Right for a transactional source, whose replay of a txid is
    the same batch."""

    kind = StateKind.TRANSACTIONAL

    def columns(self, value_type: str) -> list[str]:
        return ["txid bigint NOT NULL"]

    def upsert(self, combine: Combine, combiner: str) -> Upsert:
        return Upsert(
            "value, txid",
            "delta, CAST(:txid AS bigint)",
            "value = CASE WHEN s.txid = EXCLUDED.txid THEN s.value "
            f"ELSE {combine('s.value', 'EXCLUDED.value')} END, txid = EXCLUDED.txid",
            "WHERE s.txid <= EXCLUDED.txid",
        )


class OpaqueRule(KindRule):
    """Stores the txid and the value before it: a key whose stored txid is the current one
    re-applies over that previous value (``value := prev_value ⊕ delta``: a replay may be a
    different batch); else ``prev_value := value, value := value ⊕ delta``. Right for any
    source."""

    kind = StateKind.OPAQUE

    def columns(self, value_type: str) -> list[str]:
        return [f"prev_value {value_type}", "txid bigint NOT NULL"]

    def upsert(self, combine: Combine, combiner: str) -> Upsert:
        prev_plus = (
            "COALESCE(s.prev_value, 0) + EXCLUDED.value"  # a key new in the replayed txid
            if combiner == "sum"
            else combine("s.prev_value", "EXCLUDED.value")  # GREATEST/LEAST skip NULL
        )
        return Upsert(
            "value, prev_value, txid",
            "delta, NULL, CAST(:txid AS bigint)",
            f"value = CASE WHEN s.txid = EXCLUDED.txid THEN {prev_plus} "
            f"ELSE {combine('s.value', 'EXCLUDED.value')} END, "
            "prev_value = CASE WHEN s.txid = EXCLUDED.txid THEN s.prev_value ELSE s.value END, "
            "txid = EXCLUDED.txid",
            "WHERE s.txid <= EXCLUDED.txid",
        )


RULES: Mapping[StateKind, KindRule] = {
    rule.kind: rule for rule in (NonTransactionalRule(), TransactionalRule(), OpaqueRule())
}
"""The rule of each kind."""


def rule_for(kind: StateKind | str) -> KindRule:
    return RULES[StateKind(kind)]


__all__ = [
    "RULES",
    "KindRule",
    "NonTransactionalRule",
    "OpaqueRule",
    "TransactionalRule",
    "Upsert",
    "rule_for",
]
