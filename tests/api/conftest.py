"""An in-process gRPC server over the `db` fixture, and a client stub connected to it.

Every API test module can use `stub` (and `services`, to arrange state directly). The clock is the real
one; a module that needs to move time overrides the `clock` fixture with a `FakeClock`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from rackflow.api.servicer import FlowServicer
from rackflow.clock import Clock, SystemClock
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2_grpc


@pytest.fixture
def clock() -> Clock:
    return SystemClock()


@pytest.fixture
def services(db: Database, clock: Clock) -> Services:
    return Services.build(db, clock)


@pytest.fixture
async def grpc_server(services: Services) -> AsyncIterator[str]:
    """A started server on a free localhost port; yields its address and stops it afterwards."""
    server = grpc.aio.server()
    flow_pb2_grpc.add_FlowServicer_to_server(FlowServicer(services), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def stub(grpc_server: str) -> AsyncIterator[flow_pb2_grpc.FlowStub]:
    async with grpc.aio.insecure_channel(grpc_server) as channel:
        yield flow_pb2_grpc.FlowStub(channel)
