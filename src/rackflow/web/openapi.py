"""The OpenAPI 3.1 document of the JSON API (`GET /api/v1/openapi.json`), made from the endpoint table the
routes are made from (`JsonApi.endpoints`) and the protobuf descriptors of the RPCs' messages, so a client
can generate an SDK from it and it cannot drift from what the server serves.

Schemas follow what the API sends and takes: proto field names (`message_json`), enums by name, 64-bit
integers as strings, `Timestamp` as an RFC 3339 string, `FieldMask` as comma-separated paths. A request
body is the request message less the fields its path sets (`…Body`). Every error is `Error`.
"""

from __future__ import annotations

import re
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from rackflow.web.api import PREFIX, Endpoint, Param
from rackflow.web.bodies import DURATION_SECONDS, RELATIVE_TIMES, real_oneof

OPENAPI_PATH = f"{PREFIX}/openapi.json"
TITLE = "rackflow JSON API"
VERSION = "v1"
_PATH_PARAM = re.compile(r"\{(\w+)\}")
_PATH_PARAM_DOC = {"ref": "an id, or a name (schedules, racks, windows, budgets)", "scope_id": "a scope's id"}
_QUERY_SCHEMA: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer", "format": "int32"},
    "boolean": {"type": "boolean"},
    "time": {"type": "string", "format": "date-time"},
    "since": {"type": "string", "description": "an RFC 3339 time, or a duration back from now (24h)"},
    "list": {"type": "array", "items": {"type": "string"}},
}
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?\d+(\.\d+)?s$"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Empty": {"type": "object", "additionalProperties": False},
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
}
_INTEGER_32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
_INTEGER_64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every refusal and failure: `code` is the gRPC status code name, `field` the request "
    "field (or query parameter) the message names, or null. A refusal that answers a firing (a trigger that "
    "fired but submitted no task) names its run as the trigger's success does: `run_id`, `fired_at`, and "
    "`replayed` (true: the answer of an earlier trigger with the same request_id; nothing new fired).",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "field": {"type": ["string", "null"]},
        "run_id": {"$ref": "#/components/schemas/rackflow.v1.UUID"},
        "fired_at": {"type": "string", "format": "date-time"},
        "replayed": {"type": "boolean"},
    },
    "required": ["code", "message", "field"],
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


class _Schemas:
    """The component schemas, each message and enum once, added as they are first referred to."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {"Error": ERROR_SCHEMA}

    def message(
        self, descriptor: Descriptor | Any, omit: tuple[str, ...] = (), name: str | None = None
    ) -> dict[str, str]:
        name = name or descriptor.full_name
        if name in self.components:
            return ref(name)
        self.components[name] = {}  # taken before the fields, so a recursive message refers to itself
        properties = {f.name: self.field(f) for f in descriptor.fields if f.name not in omit}
        schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        choices = {o.name: [f.name for f in o.fields] for f in descriptor.fields if (o := real_oneof(f))}
        if choices:
            schema["description"] = "; ".join(
                f"at most one of {', '.join(names)}" for names in choices.values()
            )
        self.components[name] = schema
        return ref(name)

    def enum(self, descriptor: EnumDescriptor | Any) -> dict[str, str]:
        name = descriptor.full_name
        if name not in self.components:
            self.components[name] = {"type": "string", "enum": [v.name for v in descriptor.values]}
        return ref(name)

    def field(self, field: FieldDescriptor | Any) -> dict[str, Any]:
        nested = field.message_type
        if nested is not None and nested.GetOptions().map_entry:
            value = nested.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self.single(value)}
        one = self.single(field)
        return {"type": "array", "items": one} if field.is_repeated else one

    def single(self, field: FieldDescriptor | Any) -> dict[str, Any]:
        nested = field.message_type
        if nested is not None:
            if nested.full_name == "google.protobuf.Timestamp" and field.name in RELATIVE_TIMES:
                return {
                    "type": "string",
                    "description": "an RFC 3339 time, or (in a request) a duration from now like 2h",
                }
            if nested.full_name in _WELL_KNOWN:
                return dict(_WELL_KNOWN[nested.full_name])
            return self.message(nested)
        if field.enum_type is not None:
            return self.enum(field.enum_type)
        if field.name in DURATION_SECONDS:
            return {
                "type": ["integer", "string"],
                "description": "whole seconds, or (in a request) a duration like 30m",
            }
        if field.type in _INTEGER_32:
            return {"type": "integer", "format": "int32"}
        if field.type in _INTEGER_64:
            return {"type": "string", "format": "int64"}
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return {"type": "number"}
        if field.type == FieldDescriptor.TYPE_BOOL:
            return {"type": "boolean"}
        if field.type == FieldDescriptor.TYPE_BYTES:
            return {"type": "string", "contentEncoding": "base64"}
        return {"type": "string"}


def _parameter(param: Param) -> dict[str, Any]:
    return {
        "name": param.name,
        "in": "query",
        "required": False,
        "description": param.doc,
        "schema": _QUERY_SCHEMA[param.kind],
        **({"style": "form", "explode": True} if param.kind == "list" else {}),
    }


def _operation(endpoint: Endpoint, schemas: _Schemas) -> dict[str, Any]:
    path_params = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAM_DOC.get(name, name),
            "schema": {"type": "string"},
        }
        for name in _PATH_PARAM.findall(endpoint.path)
    ]
    operation: dict[str, Any] = {
        "operationId": endpoint.handler.__name__,
        "summary": endpoint.summary,
        "description": f"Runs the `{endpoint.rpc}` RPC (docs/API.md), with its roles and audit.",
        "x-rpc": endpoint.rpc,
        "parameters": [*path_params, *(_parameter(p) for p in endpoint.params)],
        "responses": {
            "200": {
                "description": f"the {endpoint.response_type.name}",
                "content": {"application/json": {"schema": schemas.message(endpoint.response_type)}},
            },
            "default": {
                "description": "an error (HTTP status from the code: docs/HTTP.md)",
                "content": {"application/json": {"schema": ref("Error")}},
            },
        },
    }
    if endpoint.body:
        request = endpoint.request_type
        omit = tuple(f for f in endpoint.path_fields if f in request.fields_by_name)
        schema = schemas.message(request, omit, f"{request.full_name}Body" if omit else None)
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": schema}},
        }
    return operation


def document(endpoints: list[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `endpoints`, and of itself."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(PREFIX + endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, schemas)
    paths[OPENAPI_PATH] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "responses": {
                "200": {"description": "the OpenAPI document", "content": {"application/json": {}}}
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": TITLE,
            "version": VERSION,
            "description": "The rackflow JSON API: each endpoint runs one gRPC RPC of rackflow.v1.Flow, with "
            "the same validation, roles and audit (docs/HTTP.md). With tokens configured, send "
            "`Authorization: Bearer <token>`.",
        },
        "paths": paths,
        "security": [{"bearer": []}, {}],  # a bearer token when tokens are configured, else none
        "components": {
            "schemas": dict(sorted(schemas.components.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
