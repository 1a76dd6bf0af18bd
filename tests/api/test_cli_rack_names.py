"""The CLI against an in-process server over the `db` fixture: what a run's table asks the server for to
name its racks, recorded as the server receives it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf.message import Message

from rackflow.api.servicer import FlowServicer
from rackflow.cli.main import main
from rackflow.domain.inventory import ComponentSpec, ComponentType
from rackflow.services import Services
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.api.test_schedules_api import config, power_off

pytestmark = pytest.mark.asyncio


class Recorded(grpc.aio.ServerInterceptor):
    """Each request the server receives, by RPC name, in order."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Message]] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        answer, rpc = handler.unary_unary, details.method.rsplit("/", 1)[-1]

        async def recorded(request: Message, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.requests.append((rpc, request))
            return await answer(request, context)

        return grpc.unary_unary_rpc_method_handler(
            recorded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@pytest.fixture
async def server(services: Services) -> AsyncIterator[tuple[str, Recorded]]:
    recorded = Recorded()
    server = grpc.aio.server(interceptors=[recorded])
    flow_pb2_grpc.add_FlowServicer_to_server(FlowServicer(services), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", recorded
    finally:
        await server.stop(grace=None)


async def test_a_run_of_250_racks_reads_those_racks_alone_in_one_call(
    services: Services, server: tuple[str, Recorded]
) -> None:
    """Past 100 racks, a run's table read the whole rack list for its names (20 pages at 20,000 racks):
    it asks for the run's racks by id, in one ListRacks, and names every one."""
    address, recorded = server
    names = [f"r{i:03}" for i in range(260)]
    for name in names:
        await services.inventory.create_rack(name, components=[ComponentSpec(ComponentType.COMPUTE, "c")])
    async with grpc.aio.insecure_channel(address) as channel:
        stub = flow_pb2_grpc.FlowStub(channel)
        create = pb.CreateTaskScheduleRequest(schedule=config("wide"), operation=power_off(*names[:250]))
        schedule = await stub.CreateTaskSchedule(create)
        await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
        [fired] = (
            await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
        ).runs
    recorded.requests.clear()

    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["--server", address, "run", "show", fired.id.id]
    )

    assert result.exit_code == 0, result.output
    shown = {line.split()[0] for line in result.output.splitlines() if re.match(r"r\d{3} ", line)}
    assert shown == set(names[:250])
    reads = [request for rpc, request in recorded.requests if rpc in ("ListRacks", "GetRack")]
    assert [type(r).__name__ for r in reads] == ["ListRacksRequest"]
    assert isinstance(reads[0], pb.ListRacksRequest)
    assert {r.id for r in reads[0].ids} == {o.rack_id.id for o in fired.outcomes} and len(reads[0].ids) == 250
