"""Requests whose bytes do not parse, sent raw (no serializer) to a server wired like `rackflow serve`:
INVALID_ARGUMENT with the parser's reason, for every RPC, and nothing written but a mutating RPC's audit
event."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2
from sqlalchemy import text

from rackflow.api.auth import is_mutating
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2 as pb
from tests.api.secured import FLOW, HEALTH, OPERATOR_TOKEN, TOKENS, bearer, secured_server
from tests.conftest import table_counts

RPCS = sorted(pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name)
NOT_UTF8 = b"\xff\xfe"
# Field 1, length-delimited, 5 bytes long, with 2 sent: no message parses it.
TRUNCATED = b"\x0a\x05ab"


@pytest.fixture
async def channel(services: Services) -> AsyncIterator[grpc.aio.Channel]:
    """Without tokens: the anonymous caller may call every RPC, the approvals too."""
    async with secured_server(services, None) as address, grpc.aio.insecure_channel(address) as channel:
        yield channel


async def raw_call(
    channel: grpc.aio.Channel, method: str, data: bytes, token: str | None = None
) -> grpc.aio.AioRpcError:
    """Send `data` as the request of `method`, as they are; the error it is answered with."""
    call = channel.unary_unary(method)  # no serializers: bytes in, bytes out
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(data, metadata=bearer(token) if token else None, timeout=10)
    return info.value


def with_bad_utf8(message: pb.CreateRackRequest | pb.AddComponentsRequest, good: str) -> bytes:
    """The message's bytes with the string `good` made invalid UTF-8 (its length kept)."""
    data = message.SerializeToString()
    assert data.count(good.encode()) == 1
    return data.replace(good.encode(), good.encode()[: -len(NOT_UTF8)] + NOT_UTF8)


async def test_a_string_field_that_is_not_utf8_is_invalid_argument(
    channel: grpc.aio.Channel, services: Services, db: Database
) -> None:
    rack = await services.inventory.create_rack("r1")
    before = await table_counts(db)
    top_level = with_bad_utf8(pb.CreateRackRequest(name="rack-2"), "rack-2")
    nested = with_bad_utf8(
        pb.AddComponentsRequest(
            rack_id=pb.UUID(id=str(rack.id)),
            components=[pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="node-0")],
        ),
        "node-0",
    )
    for rpc, data in (("CreateRack", top_level), ("AddComponents", nested)):
        error = await raw_call(channel, f"/{FLOW}/{rpc}", data)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == (
            f"request: the bytes sent do not parse: Error parsing message with type "
            f"'rackflow.v1.{rpc}Request': String field had bad UTF-8"
        )
    # Refused before the handler: nothing is written but each call's audit event (`record_refusal`).
    assert await table_counts(db) == before | {"audit_events": before["audit_events"] + 2}


async def test_every_rpc_refuses_a_request_that_does_not_parse(
    channel: grpc.aio.Channel, db: Database
) -> None:
    before = await table_counts(db)
    answers = {rpc: await raw_call(channel, f"/{FLOW}/{rpc}", TRUNCATED) for rpc in RPCS}
    assert {rpc: error.code() for rpc, error in answers.items()} == dict.fromkeys(
        RPCS, grpc.StatusCode.INVALID_ARGUMENT
    )
    assert all(
        (error.details() or "").startswith("request: the bytes sent do not parse: ")
        for error in answers.values()
    )
    mutating = [rpc for rpc in RPCS if is_mutating(rpc)]
    assert await table_counts(db) == before | {"audit_events": before["audit_events"] + len(mutating)}
    async with db.read() as conn:
        recorded = await conn.execute(text("SELECT method, outcome FROM audit_events"))
        assert sorted((method, outcome) for method, outcome in recorded) == [
            (rpc, "INVALID_ARGUMENT") for rpc in mutating
        ]


async def test_authentication_comes_before_parsing(services: Services) -> None:
    """A caller without a valid token learns nothing of its request, parsable or not."""
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        assert (await raw_call(channel, f"/{FLOW}/CreateRack", TRUNCATED)).code() == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        authenticated = await raw_call(channel, f"/{FLOW}/CreateRack", TRUNCATED, token=OPERATOR_TOKEN)
        assert authenticated.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_check_refuses_a_service_name_that_is_not_utf8(channel: grpc.aio.Channel) -> None:
    data = health_pb2.HealthCheckRequest(service="ab").SerializeToString().replace(b"ab", NOT_UTF8)
    error = await raw_call(channel, f"/{HEALTH}/Check", data)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "String field had bad UTF-8" in (error.details() or "")
