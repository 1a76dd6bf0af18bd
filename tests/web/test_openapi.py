"""The OpenAPI document at /api/v1/openapi.json against the server's own routes: every route with its
methods and nothing more, the query parameters each endpoint takes, schemas from the RPCs' messages, and
a well-formed OpenAPI 3.1 structure (every reference resolves, ids unique, path parameters declared)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from rackflow.api.audit import AuditInterceptor
from rackflow.services import Services
from rackflow.v1 import flow_pb2 as pb
from rackflow.web.api import PREFIX, JsonApi
from rackflow.web.app import build_app
from rackflow.web.openapi import OPENAPI_PATH
from tests.api.secured import TOKENS
from tests.web.conftest import BASE_URL, make_racks, make_schedule

METHODS = {"get", "post", "put", "patch", "delete"}
FLOW = pb.DESCRIPTOR.services_by_name["Flow"]


@pytest.fixture
async def doc(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get(OPENAPI_PATH)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    return dict(response.json())


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            assert method in METHODS, (path, method)
            yield path, method, operation


def refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref":
                yield item
            else:
                yield from refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs(item)


async def test_the_document_has_every_route_with_its_methods_and_nothing_else(
    services: Services, doc: dict[str, Any]
) -> None:
    app = build_app(services, AuditInterceptor(services.audit), None, services.clock)
    served: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith(PREFIX):
            served.setdefault(route.path, set()).update(m.lower() for m in route.methods or () if m != "HEAD")
    documented = {path: set(item) for path, item in doc["paths"].items()}
    assert documented == served
    assert len(served) >= 25 and OPENAPI_PATH in served


async def test_each_operation_takes_the_query_parameters_it_documents(
    http: httpx.AsyncClient, doc: dict[str, Any]
) -> None:
    """An undeclared parameter is refused before anything runs, naming what the endpoint takes: the
    documented parameters, exactly."""
    for path, method, operation in operations(doc):
        if path == OPENAPI_PATH:
            continue
        url = re.sub(r"\{\w+\}", "ghost", path)
        response = await http.request(method.upper(), url, params={"zzz": "1"})
        assert response.status_code == 400, (method, path, response.text)
        body = response.json()
        assert body["field"] == "zzz", body
        takes = re.search(r"this endpoint takes: (.*)\)$", body["message"])
        assert takes is not None, body
        named = sorted(p["name"] for p in operation["parameters"] if p["in"] == "query")
        assert takes.group(1) == (", ".join(named) or "none"), (method, path)


async def test_the_schemas_are_the_rpc_messages(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    endpoints = {(e.method.lower(), PREFIX + e.path): e for e in JsonApi.endpoints()}
    for path, method, operation in operations(doc):
        if path == OPENAPI_PATH:
            continue
        endpoint = endpoints[(method, path)]
        rpc = FLOW.methods_by_name[operation["x-rpc"]]
        answers = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        expected = endpoint.answers.full_name if endpoint.answers else rpc.output_type.full_name
        assert answers == f"#/components/schemas/{expected}"
        body = operation.get("requestBody")
        assert (body is not None) == endpoint.body, (method, path)
        if body is not None:
            name = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            fields = {f.name for f in rpc.input_type.fields} - set(endpoint.path_fields)
            assert set(schemas[name]["properties"]) == fields, (method, path)
    schedule = schemas["rackflow.v1.TaskSchedule"]["properties"]
    assert schedule["created_at"] == {"type": "string", "format": "date-time"}
    assert schedule["spec"] == {"$ref": "#/components/schemas/rackflow.v1.ScheduleSpec"}
    assert schemas["rackflow.v1.WindowKind"]["enum"][1:] == ["WINDOW_KIND_ALLOW", "WINDOW_KIND_FREEZE"]
    assert schemas["rackflow.v1.MaintenanceWindow"]["properties"]["racks"]["type"] == "array"


async def test_the_document_is_well_formed_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] and doc["info"]["version"] == "v1"
    schemas = doc["components"]["schemas"]
    for reference in refs(doc):
        assert reference.startswith("#/components/schemas/") and reference.rsplit("/", 1)[1] in schemas
    referenced = {r.rsplit("/", 1)[1] for r in refs(doc)}
    assert set(schemas) == referenced  # no schema is left over
    ids = [operation["operationId"] for _, _, operation in operations(doc)]
    assert len(ids) == len(set(ids))
    for path, method, operation in operations(doc):
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", path)), (method, path)
        assert "200" in operation["responses"], (method, path)
        assert path == OPENAPI_PATH or "default" in operation["responses"], (method, path)


async def test_a_response_has_the_fields_its_schema_names(
    http: httpx.AsyncClient, services: Services, doc: dict[str, Any]
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    schemas = doc["components"]["schemas"]
    schedule = (await http.get(f"{PREFIX}/schedules/nightly")).json()
    assert set(schedule) <= set(schemas["rackflow.v1.TaskSchedule"]["properties"])
    listed = (await http.get(f"{PREFIX}/schedules")).json()
    assert set(listed) == set(schemas["rackflow.v1.ListTaskSchedulesResponse"]["properties"])


async def test_the_document_needs_no_credentials(services: Services) -> None:
    app = build_app(services, AuditInterceptor(services.audit), TOKENS, services.clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
        assert (await client.get(OPENAPI_PATH)).status_code == 200
        assert (await client.get(f"{PREFIX}/schedules")).status_code == 401
