"""Bearer tokens and roles through a real gRPC server: who may call what, and what a refusal looks like."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rackflow.api.audit import RPC_NAMES
from rackflow.api.auth import is_mutating
from rackflow.security import ServerTls, server_credentials
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.certs import Pki, make_pki
from tests.conftest import table_counts


@pytest.fixture
async def channel(services: Services) -> AsyncIterator[grpc.aio.Channel]:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        yield channel


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> FlowStub:
    return FlowStub(channel)


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer not-a-known-token"),),
        (("authorization", f"Basic {VIEWER_TOKEN}"),),
        (("authorization", "Bearer "),),
    ],
)
async def test_missing_or_unknown_token_is_unauthenticated(
    stub: FlowStub, metadata: tuple[tuple[str, str], ...], db: Database
) -> None:
    before = await table_counts(db)
    for call in (
        stub.ListRacks(pb.ListRacksRequest(), metadata=metadata),
        stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=metadata),
    ):
        error = await refused(call)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await table_counts(db) == before


async def test_viewer_reads_but_may_not_mutate(stub: FlowStub, services: Services, db: Database) -> None:
    await services.inventory.create_rack("r1")
    racks = await stub.ListRacks(pb.ListRacksRequest(), metadata=bearer(VIEWER_TOKEN))
    assert [r.name for r in racks.racks] == ["r1"]
    daily = pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="@daily")
    preview = await stub.PreviewScheduleSpec(
        pb.PreviewScheduleSpecRequest(spec=daily, count=2), metadata=bearer(VIEWER_TOKEN)
    )
    assert len(preview.times) == 2

    before = await table_counts(db)
    delete = pb.DeleteRackRequest(id=racks.racks[0].id)
    error = await refused(stub.DeleteRack(delete, metadata=bearer(VIEWER_TOKEN)))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "DeleteRack" in (error.details() or "") and "operator" in (error.details() or "")
    after = await table_counts(db)  # nothing changed; the trail says who tried (test_audit.py)
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 1}


async def test_operator_may_mutate(stub: FlowStub) -> None:
    rack = await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=bearer(OPERATOR_TOKEN))
    await stub.DeleteRack(pb.DeleteRackRequest(id=rack.id), metadata=bearer(OPERATOR_TOKEN))
    listed = await stub.ListRacks(pb.ListRacksRequest(), metadata=bearer(OPERATOR_TOKEN))
    assert listed.total == 0


async def test_a_pause_names_the_principal_that_paused(stub: FlowStub, services: Services) -> None:
    operator = bearer(OPERATOR_TOKEN)
    rack = await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=operator)
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(id=rack.id)]))
    schedule = await stub.CreateTaskSchedule(
        pb.CreateTaskScheduleRequest(
            schedule=pb.ScheduleConfig(
                name="nightly", spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")
            ),
            operation=pb.ScheduledOperation(power_off=pb.PowerOffRackRequest(target_spec=target)),
        ),
        metadata=operator,
    )
    paused = await stub.PauseTaskSchedule(
        pb.PauseTaskScheduleRequest(id=schedule.id, reason="maintenance"), metadata=operator
    )
    assert paused.paused_by == "oncall" and paused.pause_reason == "maintenance"


def test_every_rpc_is_classified_by_its_name() -> None:
    """The role rule is by prefix; this pins which RPCs a viewer may call, so a new RPC is a decision."""
    reads = {name for name in RPC_NAMES if not is_mutating(name)}
    assert reads == {
        "GetRack",
        "ListRacks",
        "ListNVLDomains",
        "ListTasks",
        "GetTasksByIDs",
        "GetTaskSchedule",
        "ListTaskSchedules",
        "ListTaskScheduleScopes",
        "CheckScheduleConflicts",
        "PreviewScheduleSpec",
        "ListTaskScheduleRuns",
        "GetTaskScheduleRun",
        "ListAuditEvents",
        "GetMaintenanceWindow",
        "ListMaintenanceWindows",
        "PreviewMaintenanceWindows",
        "PreviewTaskSchedule",
        "GetOperationBudget",
        "ListOperationBudgets",
        "GetNotificationChannel",
        "ListNotificationChannels",
        "ListNotificationDeliveries",
        "GetPreflightCheck",
        "ListPreflightChecks",
    }


async def test_health_and_reflection_need_no_token(channel: grpc.aio.Channel) -> None:
    check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = [
        r
        async for r in reflect.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    ]
    names = {s.name for s in replies[0].list_services_response.service}
    assert "rackflow.v1.Flow" in names


async def test_tokens_never_reach_logs_or_replies(stub: FlowStub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = (("authorization", "Bearer wrong-but-secret-looking-token"),)
    error = await refused(stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=wrong))
    denied = await refused(stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=bearer(VIEWER_TOKEN)))
    await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=bearer(OPERATOR_TOKEN))
    shown = caplog.text + (error.details() or "") + (denied.details() or "")
    for secret in ("wrong-but-secret-looking-token", VIEWER_TOKEN, OPERATOR_TOKEN):
        assert secret not in shown
    assert "refused CreateRack" in caplog.text


async def test_without_tokens_every_caller_is_an_anonymous_operator(services: Services) -> None:
    async with secured_server(services, None) as address, grpc.aio.insecure_channel(address) as channel:
        rack = await FlowStub(channel).CreateRack(pb.CreateRackRequest(name="r1"))
        events = await FlowStub(channel).ListAuditEvents(pb.ListAuditEventsRequest())
    assert [(e.principal, e.method, e.target_ids[0].id) for e in events.events] == [
        ("anonymous", "CreateRack", rack.id.id)
    ]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_credentials(pki: Pki, *, with_cert: bool) -> grpc.ChannelCredentials:
    cert, key = pki.client.read() if with_cert else (None, None)
    return grpc.ssl_channel_credentials(pki.ca.cert.read_bytes(), private_key=key, certificate_chain=cert)


async def test_mutual_tls_names_the_certificate_as_principal(services: Services, pki: Pki) -> None:
    credentials = server_credentials(ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert)))
    async with secured_server(services, None, credentials) as address:
        async with grpc.aio.secure_channel(address, client_credentials(pki, with_cert=True)) as channel:
            await FlowStub(channel).CreateRack(pb.CreateRackRequest(name="r1"))
            events = await FlowStub(channel).ListAuditEvents(pb.ListAuditEventsRequest())
        assert [e.principal for e in events.events] == ["ops-laptop"]
        async with grpc.aio.secure_channel(address, client_credentials(pki, with_cert=False)) as channel:
            error = await refused(FlowStub(channel).ListRacks(pb.ListRacksRequest(), timeout=5))
        assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_with_tokens_a_certificate_alone_is_not_enough(services: Services, pki: Pki) -> None:
    credentials = server_credentials(ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert)))
    async with (
        secured_server(services, TOKENS, credentials) as address,
        grpc.aio.secure_channel(address, client_credentials(pki, with_cert=True)) as channel,
    ):
        flow = FlowStub(channel)
        error = await refused(flow.ListRacks(pb.ListRacksRequest()))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        await flow.CreateRack(pb.CreateRackRequest(name="r1"), metadata=bearer(OPERATOR_TOKEN))
        events = await flow.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=bearer(VIEWER_TOKEN))
    assert [e.principal for e in events.events] == ["oncall"]
