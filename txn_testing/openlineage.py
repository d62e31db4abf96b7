"""OpenLineage run events checked as an independent consumer would, offline.

:class:`EventSchemas` validates an event against the spec's RunEvent schema and every facet in it
against the schema its ``_schemaURL`` names (each resolved by ``$id`` among local files: the
spec's, copied into ``tests/data/openlineage/<version>/``, and any others given, such as the
provider's own facet schemas); a facet whose schema is not among them is a problem too.
:func:`lifecycle_problems` checks each run's order of events: it begins with START and ends with
exactly one of COMPLETE, FAIL or ABORT, the spec's rule for a run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from airflow_txn_provider.compat.python import fromisoformat

SPEC_VERSION = "2-0-2"
SPEC = Path(__file__).resolve().parents[1] / "tests" / "data" / "openlineage" / SPEC_VERSION
"""The spec's schemas, as copied into the repository (their README says from where)."""
RUN_EVENT_SCHEMA = f"https://openlineage.io/spec/{SPEC_VERSION}/OpenLineage.json"
TERMINAL = frozenset({"COMPLETE", "FAIL", "ABORT"})
"""Event types that end a run (the spec: exactly one per run)."""
Event = Mapping[str, Any]


def load_schemas(*folders: Path) -> dict[str, dict[str, Any]]:
    """Every JSON schema under ``folders``, by its ``$id``."""
    schemas: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.json")):
            schema = json.loads(path.read_text(encoding="utf-8"))
            if "$id" not in schema:
                raise ValueError(f"{path}: a schema without $id cannot be named by a _schemaURL")
            schemas[schema["$id"]] = schema
    return schemas


def set_from_outside(event: Event) -> bool:
    """Whether Airflow's OpenLineage listener (provider 2.20) sent ``event`` for a state set
    from outside the task: through the REST API (a run marked failed: a rewind, a test's
    cleanup) or by the executor (a task it lost track of). It sends such an event also for a
    task that never ran on a worker (a terminal event without START): not the run's own."""
    message = str((event.get("run", {}).get("facets", {}).get("errorMessage") or {}).get("message"))
    return "state was manually set to" in message or " reported that the task instance " in message


def spec_schemas(*more: Path) -> EventSchemas:
    """A validator of the spec's schemas (:data:`SPEC`) and those under ``more`` folders."""
    return EventSchemas(load_schemas(SPEC, *more), RUN_EVENT_SCHEMA)


def _formats() -> jsonschema.FormatChecker:
    """The spec's formats, checked without the optional packages jsonschema would use for them
    (without those it checks no ``uri`` and no ``date-time`` at all)."""
    checker = jsonschema.FormatChecker(["uuid"])

    @checker.checks("uri", raises=ValueError)
    def is_uri(value: object) -> bool:
        parts = urlsplit(str(value))
        return bool(parts.scheme and (parts.netloc or parts.path))

    @checker.checks("date-time", raises=ValueError)
    def is_date_time(value: object) -> bool:
        return fromisoformat(str(value)).tzinfo is not None  # RFC 3339: an offset

    return checker


class EventSchemas:
    """Validates run events against the spec at ``run_event`` (``$id`` of ``OpenLineage.json``)
    and each facet against its own ``_schemaURL``, among ``schemas`` (:func:`load_schemas`)."""

    def __init__(self, schemas: Mapping[str, dict[str, Any]], run_event: str) -> None:
        if run_event not in schemas:
            raise ValueError(f"no schema {run_event} among {sorted(schemas)}")
        self.schemas = dict(schemas)
        self.registry: Registry = Registry().with_resources(
            (uri, Resource.from_contents(s, default_specification=DRAFT202012))
            for uri, s in self.schemas.items()
        )
        self._checker = _formats()
        self._event = self._validator(f"{run_event}#/$defs/RunEvent")
        self._facets: dict[str, jsonschema.Draft202012Validator] = {}

    def _validator(self, ref: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(
            {"$ref": ref}, registry=self.registry, format_checker=self._checker
        )

    def problems(self, event: Event) -> list[str]:
        """What is wrong with ``event``: each schema error, with where it is."""
        found = [f"event: {_say(e)}" for e in self._event.iter_errors(event)]
        for place, key, facet in facets_of(event):
            where = f"{place}.{key}"
            url = facet.get("_schemaURL") if isinstance(facet, Mapping) else None
            if not isinstance(url, str):
                found.append(f"{where}: no _schemaURL")
                continue
            if url.split("#", 1)[0] not in self.schemas:
                found.append(f"{where}: its schema {url} is not one of the known schemas")
                continue
            if url not in self._facets:
                self._facets[url] = self._validator(url)
            found += [f"{where} ({url}): {_say(e)}" for e in self._facets[url].iter_errors(facet)]
        return found


def _say(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f"at /{path}: {error.message[:300]}"


def facets_of(event: Event) -> Iterable[tuple[str, str, Any]]:
    """``(where, key, facet)`` of every facet of ``event``: run, job, datasets, inputs and
    outputs."""
    places: list[tuple[str, Any]] = [
        ("run", event.get("run", {}).get("facets")),
        ("job", event.get("job", {}).get("facets")),
    ]
    for side, own in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for n, dataset in enumerate(event.get(side) or ()):
            places.append((f"{side}[{n}]", dataset.get("facets")))
            places.append((f"{side}[{n}].{own}", dataset.get(own)))
    for where, facets in places:
        for key, facet in (facets or {}).items():
            yield where, key, facet


def lifecycle_problems(
    events: Iterable[Event],
    *,
    outside: Callable[[Event], bool] = lambda event: False,
    ended_silently: Callable[[list[Event]], bool] = lambda run: False,
) -> list[str]:
    """Each run's events in order (by ``eventTime``), every run having ended: it begins with
    START and ends with exactly one terminal event, with no START or RUNNING after it.

    :param outside: events a scheduler sends about a run it ended from outside (Airflow's
        listener, when its REST API or executor sets a task's state): such a run is not expected
        to end by itself, and those events are not the run's own.
    :param ended_silently: whether a run without a terminal event was ended where no event is
        sent (asked only of those): Airflow skips a task that waits to resume when its run is
        marked failed, and clears a deferred one, without telling its listeners.

    A repeated START before the end is allowed: Airflow's listener sends one each time a
    deferred task resumes on a worker, with the same run id.
    """
    runs: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        runs[str(event.get("run", {}).get("runId"))].append(event)
    found = []
    for run_id, run in runs.items():
        run.sort(key=lambda e: fromisoformat(str(e.get("eventTime"))))
        own = [e for e in run if not outside(e)]
        if not own:  # ended from outside before it ever ran: none of its own events
            continue
        kinds = [str(e.get("eventType")) for e in own]
        job = own[0].get("job", {}).get("name")
        if kinds[0] != "START":
            found.append(f"run {run_id} ({job}) begins with {kinds[0]}, not START: {kinds}")
        terminal = [n for n, kind in enumerate(kinds) if kind in TERMINAL]
        if len(terminal) > 1:
            found.append(f"run {run_id} ({job}) ends {len(terminal)} times: {kinds}")
        if terminal and {"START", "RUNNING"} & set(kinds[terminal[0] + 1 :]):
            found.append(f"run {run_id} ({job}) goes on after it ended: {kinds}")
        if not terminal and len(own) == len(run) and not ended_silently(run):
            found.append(f"run {run_id} ({job}) ended without COMPLETE, FAIL or ABORT: {kinds}")
    return found
