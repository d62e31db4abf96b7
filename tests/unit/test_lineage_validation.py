"""The OpenLineage checker the real-Airflow tests use (txn_testing/openlineage.py) fails on what
it must: events off the spec's schemas, facets off their own, runs that do not end once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from txn_testing.openlineage import SPEC, EventSchemas, lifecycle_problems, spec_schemas

RUN = "01950000-0000-7000-8000-000000000001"
SPEC_FACETS = "https://openlineage.io/spec/facets"


def _event(kind: str = "START", at: str = "00", run: str = RUN, **more: Any) -> dict[str, Any]:
    return {
        "eventType": kind,
        "eventTime": f"2026-01-01T00:00:{at}+00:00",
        "producer": "https://example.org/producer/1.0",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run, "facets": {}},
        "job": {"namespace": "default", "name": "words.commit"},
        "inputs": [],
        "outputs": [],
        **more,
    }


@pytest.fixture(scope="module")
def schemas() -> EventSchemas:
    return spec_schemas()


def test_the_spec_copied_is_the_one_named():
    assert (SPEC / "OpenLineage.json").is_file() and (SPEC / "README.md").is_file()
    assert SPEC.name == "2-0-2" and len(list((SPEC / "facets").glob("*.json"))) > 30


def test_a_valid_event_passes(schemas):
    event = _event()
    event["run"]["facets"]["nominalTime"] = {
        "_producer": "https://example.org/producer/1.0",
        "_schemaURL": f"{SPEC_FACETS}/1-0-1/NominalTimeRunFacet.json#/$defs/NominalTimeRunFacet",
        "nominalStartTime": "2026-01-01T00:00:00+00:00",
    }
    assert schemas.problems(event) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda e: e.pop("producer"), "'producer' is a required property"),
        (lambda e: e["run"].update(runId="txid-7"), "is not a 'uuid'"),
        (lambda e: e.update(eventTime="yesterday"), "is not a 'date-time'"),
        (lambda e: e.update(eventTime="2026-01-01T00:00:00"), "is not a 'date-time'"),  # no offset
        (lambda e: e.update(eventType="DONE"), "is not one of"),
        (lambda e: e["job"].pop("name"), "'name' is a required property"),
    ],
)
def test_an_event_off_the_run_event_schema_fails(schemas, change, says):
    event = _event()
    change(event)
    problems = schemas.problems(event)
    assert problems and any(says in p for p in problems), problems


def _output_with(facet: dict[str, Any]) -> dict[str, Any]:
    return _event(
        "COMPLETE", outputs=[{"namespace": "file", "name": "/lake/t", "facets": {"x": facet}}]
    )


@pytest.mark.parametrize(
    ("facet", "says"),
    [
        (  # the symlinks facet wants namespace, name and type in each identifier
            {
                "_producer": "https://example.org/p",
                "_schemaURL": f"{SPEC_FACETS}/1-0-1/SymlinksDatasetFacet.json"
                "#/$defs/SymlinksDatasetFacet",
                "identifiers": [{"namespace": "postgres://h:5432/db", "name": "c.ns.t"}],
            },
            "'type' is a required property",
        ),
        (  # a schema nobody ships: the facet cannot be checked, which is a problem
            {"_producer": "https://example.org/p", "_schemaURL": "https://example.org/F.json"},
            "is not one of the known schemas",
        ),
        ({"_producer": "https://example.org/p"}, "no _schemaURL"),
        (  # the base facet's own fields
            {
                "_schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/DatasetFacet"
            },
            "'_producer' is a required property",
        ),
    ],
)
def test_a_facet_off_its_own_schema_fails(schemas, facet, says):
    problems = schemas.problems(_output_with(facet))
    assert problems and any(says in p and "outputs[0].x" in p for p in problems), problems


def test_a_run_that_starts_and_ends_once_is_fine_a_resumed_start_too():
    run = [_event("START", "00"), _event("START", "01"), _event("COMPLETE", "02")]
    assert lifecycle_problems(run) == []
    assert lifecycle_problems(list(reversed(run))) == []  # ordered by eventTime, not arrival


@pytest.mark.parametrize(
    ("kinds", "says"),
    [
        (["START"], "ended without COMPLETE, FAIL or ABORT"),  # the woken sensor's, before
        (["FAIL"], "begins with FAIL"),
        (["START", "FAIL", "FAIL"], "ends 2 times"),
        (["START", "COMPLETE", "START"], "goes on after it ended"),
    ],
)
def test_a_run_that_does_not_end_once_fails(kinds, says):
    run = [_event(kind, f"{n:02d}") for n, kind in enumerate(kinds)]
    other = [_event("START", run="01950000-0000-7000-8000-000000000002")]
    other.append(copy.deepcopy(other[0]) | {"eventType": "COMPLETE"})
    problems = lifecycle_problems(run + other)
    assert len(problems) == 1 and says in problems[0] and RUN in problems[0], problems


def test_a_run_ended_from_outside_is_not_expected_to_end_by_itself():
    manual = {"errorMessage": {"message": "TaskInstance's state was manually set to `failed`."}}

    def outside(event: dict[str, Any]) -> bool:
        return "manually set" in str(event["run"]["facets"].get("errorMessage"))

    killed = _event("FAIL", "05")
    killed["run"]["facets"] = manual
    assert lifecycle_problems([_event("START"), killed], outside=outside) == []
    assert lifecycle_problems([killed], outside=outside) == []  # it never ran: nothing of its own
    assert lifecycle_problems([_event("START")], outside=outside) != []


def test_a_run_airflow_ended_without_telling_is_excused_only_when_it_says_so():
    run = [_event("START"), _event("START", "03")]
    assert lifecycle_problems(run, ended_silently=lambda events: len(events) == 2) == []
    assert lifecycle_problems(run, ended_silently=lambda events: False) != []
