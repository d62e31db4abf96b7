"""What every named part of the transaction log runs on (:class:`LogPart`), and how
:class:`~airflow_txn_provider.transactions.transaction_log.TransactionLog` lends each part's
calls as its own (:class:`PartCall`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

P = ParamSpec("P")
R = TypeVar("R")


class LogPart:
    """One part of the transaction log: the log's database, and how long each of its calls
    waits out a restarting database (:func:`~airflow_txn_provider.utils.retries.retry_transient`).
    """

    def __init__(self, engine: Engine, outage_timeout: float) -> None:
        self.engine = engine
        self.outage_timeout = outage_timeout


class PartCall(Generic[P, R]):
    """A public call of the log done by one of its parts: with ``begin =
    PartCall("pipeline_transitions", PipelineTransitions.begin)`` in its class,
    ``txlog.begin(...)`` is ``txlog.pipeline_transitions.begin(...)``, signature and docstring
    included."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part, self.name = part, method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, txlog: None, owner: type | None = None) -> PartCall[P, R]: ...

    @overload
    def __get__(self, txlog: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, txlog: object | None, owner: type | None = None) -> Any:
        if txlog is None:
            return self
        return getattr(getattr(txlog, self.part), self.name)
