"""The log's parts (log/part.py): each public call of ``TransactionLog`` is a part's own call,
lent by name, and every public call of every part is lent exactly once."""

from __future__ import annotations

import typing

from airflow_txn_provider.log.part import LogPart, PartCall
from airflow_txn_provider.transactions.transaction_log import TransactionLog


class Counter(LogPart):
    def add(self, n: int, *, twice: bool = False) -> int:
        """Add ``n``."""
        return (self.outage_timeout + n) * (2 if twice else 1)


class Holder:
    add = PartCall("counter", Counter.add)

    def __init__(self) -> None:
        self.counter = Counter(engine=None, outage_timeout=1)  # type: ignore[arg-type]


def test_a_lent_call_is_the_parts_own_bound_method():
    holder = Holder()
    assert holder.add(2, twice=True) == 6
    assert holder.add == holder.counter.add  # the part's bound method: nothing in between
    assert Holder.add.__doc__ == "Add ``n``."
    assert isinstance(Holder.__dict__["add"], PartCall)


def test_a_part_replaced_is_the_one_called():
    holder = Holder()
    holder.counter = Counter(engine=None, outage_timeout=10)  # type: ignore[arg-type]
    assert holder.add(1) == 11


def _lent() -> dict[str, PartCall]:
    return {n: v for n, v in vars(TransactionLog).items() if isinstance(v, PartCall)}


def _parts() -> dict[str, type]:
    """Each part attribute's class (the log's annotations)."""
    hints = typing.get_type_hints(TransactionLog)
    return {n: c for n, c in hints.items() if isinstance(c, type) and issubclass(c, LogPart)}


def test_every_part_call_is_lent_once_and_names_a_part_that_has_it():
    parts, lent = _parts(), _lent()
    assert len(set(parts.values())) == len(parts) == 7
    for name, call in lent.items():
        assert call.name == name, f"{name} lends {call.part}.{call.name}"
        assert callable(getattr(parts[call.part], name, None)), f"{call.part} has no {name}"
    for part, cls in parts.items():
        public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
        missing = public - {n for n, c in lent.items() if c.part == part}
        assert not missing, f"{cls.__name__}'s {sorted(missing)} not lent by TransactionLog"
