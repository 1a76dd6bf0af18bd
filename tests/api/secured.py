"""An in-process server wired like `rackflow serve`: its interceptors (`api.servicer.interceptors`), health
and reflection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rackflow.api.audit import AuditInterceptor
from rackflow.api.servicer import FlowServicer, interceptors
from rackflow.security import Role, TokenEntry, TokenTable, hash_token
from rackflow.services import Services
from rackflow.v1 import flow_pb2, flow_pb2_grpc

VIEWER_TOKEN = "viewer-secret-7f3a0c"
OPERATOR_TOKEN = "operator-secret-91c2d4"
TOKENS = TokenTable(
    (
        TokenEntry("dashboard", Role.VIEWER, hash_token(VIEWER_TOKEN)),
        TokenEntry("oncall", Role.OPERATOR, hash_token(OPERATOR_TOKEN)),
    )
)
FLOW = flow_pb2.DESCRIPTOR.services_by_name["Flow"].full_name
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@asynccontextmanager
async def secured_server(
    services: Services,
    tokens: TokenTable | None,
    credentials: grpc.ServerCredentials | None = None,
) -> AsyncIterator[str]:
    """A started server on a free loopback port; yields HOST:PORT."""
    server = grpc.aio.server(interceptors=interceptors(tokens, AuditInterceptor(services.audit)))
    flow_pb2_grpc.add_FlowServicer_to_server(FlowServicer(services), server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    reflection.enable_server_reflection((FLOW, HEALTH, reflection.SERVICE_NAME), server)
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)
