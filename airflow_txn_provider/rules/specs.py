"""Specs: how a source or a lake sink travels to a ``spark-submit`` job and is rebuilt there.

A spec is ``{"class": "module:Name", "args": {...}}``, the object's dataclass fields as JSON on the
job's command line (no secret goes in it: credentials go by connection id). Sources and sinks use
this one mechanism, so a user's own source or sink class travels the same way as the built-in ones,
and the module that loads a spec imports none of the classes it may load.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from typing import Any


def to_spec(obj: Any) -> dict[str, Any]:
    """``obj``'s spec; ``obj`` must be a dataclass whose fields are its constructor's arguments."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"{type(obj).__name__} must be a dataclass to be passed to a job")
    cls = type(obj)
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "args": dataclasses.asdict(obj)}


MOVED_MODULES = {
    f"airflow_txn_provider.spark.{old}": f"airflow_txn_provider.sources.{new}"
    for old, new in {
        "sources": "base",
        "parquet_source": "parquet",
        "landing_source": "landing",
        "kafka_source": "kafka",
        "generated_source": "generated",
        "simulated_landing": "simulated_landing",
    }.items()
}
"""Where the built-in sources' modules went (``spark/`` → ``sources/``): a spec written before
the move, kept by Airflow in a deferred trigger's arguments, still loads after an upgrade."""


def from_spec(spec: Mapping[str, Any] | str, base: type[Any], *, what: str) -> Any:
    """The object ``spec`` (a mapping, or its JSON text) describes, which must be a ``base``;
    ``what`` names it in errors (``source``, ``lake sink``)."""
    value = json.loads(spec) if isinstance(spec, str) else spec
    if not isinstance(value, Mapping):
        raise ValueError(f"cannot load {what} from spec {spec!r}: not a mapping")
    try:
        module_name, _, qualname = str(value["class"]).partition(":")
        module_name = MOVED_MODULES.get(module_name, module_name)
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (KeyError, ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"cannot load {what} from spec {value!r}: {err}") from err
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ValueError(f"{value['class']} is not a {base.__name__}")
    return obj(**dict(value.get("args") or {}))
