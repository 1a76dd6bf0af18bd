"""Task RPCs through a real in-process gRPC server.

No executor runs here, so tasks stay where submitting or cancelling put them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.api.convert.tasks import scheduled_operation_from
from rackflow.domain.inventory import RackTarget, TargetSpec
from rackflow.domain.tasks import ConflictStrategy, Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.errors import InvalidArgument
from rackflow.services import Services
from rackflow.store import tasks as store
from rackflow.store.db import Database
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.conftest import table_counts

Stub = flow_pb2_grpc.FlowStub
QUEUE = pb.QueueOptions(conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE)


async def refused(db: Database, call: Awaitable[object], code: grpc.StatusCode, pattern: str) -> None:
    """The call fails with `code`, a message matching `pattern`, and no table changes."""
    before = await table_counts(db)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert re.search(pattern, info.value.details() or ""), info.value.details()
    assert await table_counts(db) == before


async def make_rack(stub: Stub, name: str = "r1") -> pb.Rack:
    rack: pb.Rack = await stub.CreateRack(
        pb.CreateRackRequest(
            name=name,
            components=[
                pb.ComponentSpec(type=pb.COMPONENT_TYPE_POWERSHELF, name="shelf-0"),
                pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="compute-0"),
                pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="compute-1"),
            ],
        )
    )
    return rack


def on_racks(*names: str, types: tuple[int, ...] = ()) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(
        racks=pb.RackTargets(targets=[pb.RackTarget(name=n, component_types=list(types)) for n in names])
    )


async def tasks_of(stub: Stub, response: pb.SubmitTaskResponse) -> list[pb.Task]:
    request = pb.GetTasksByIDsRequest(task_ids=response.task_ids)
    found: pb.GetTasksByIDsResponse = await stub.GetTasksByIDs(request)
    return list(found.tasks)


def power_off(*names: str, **fields: Any) -> pb.PowerOffRackRequest:
    return pb.PowerOffRackRequest(target_spec=on_racks(*names), **fields)


SUBMITTERS = [
    ("PowerOnRack", pb.PowerOnRackRequest, {}, "power_on"),
    ("PowerOffRack", pb.PowerOffRackRequest, {"forced": True}, "power_off"),
    ("PowerResetRack", pb.PowerResetRackRequest, {}, "power_reset"),
    ("BringUpRack", pb.BringUpRackRequest, {}, "bring_up"),
    ("IngestRack", pb.IngestRackRequest, {}, "ingest"),
    ("UpgradeFirmware", pb.UpgradeFirmwareRequest, {"target_version": "2.1"}, "upgrade_firmware"),
]


@pytest.mark.parametrize(
    ("method", "request_type", "fields", "operation"), SUBMITTERS, ids=[s[0] for s in SUBMITTERS]
)
async def test_each_operation_submits_one_pending_task_per_rack(
    stub: Stub, method: str, request_type: Any, fields: dict[str, Any], operation: str
) -> None:
    r1, r2 = await make_rack(stub, "r1"), await make_rack(stub, "r2")
    request = request_type(target_spec=on_racks("r1", "r2"), description="maintenance", **fields)
    submitted = await getattr(stub, method)(request)
    made = await tasks_of(stub, submitted)
    assert [t.rack_id.id for t in made] == [r1.id.id, r2.id.id]
    first = made[0]
    assert (first.operation, first.status) == (operation, pb.TASK_STATUS_PENDING)
    assert first.description == "maintenance"
    assert {c.id for c in first.component_ids} == {c.id.id for c in r1.components}
    assert first.HasField("created_at") and not first.HasField("started_at")
    assert not first.HasField("queue_expires_at") and not first.HasField("schedule_id")


async def test_component_types_narrow_the_task(stub: Stub) -> None:
    rack = await make_rack(stub)
    submitted = await stub.PowerOnRack(
        pb.PowerOnRackRequest(target_spec=on_racks("r1", types=(pb.COMPONENT_TYPE_COMPUTE,)))
    )
    [task] = await tasks_of(stub, submitted)
    computes = {c.id.id for c in rack.components if c.type == pb.COMPONENT_TYPE_COMPUTE}
    assert {c.id for c in task.component_ids} == computes


async def test_conflicts_reject_or_queue(db: Database, stub: Stub) -> None:
    await make_rack(stub)
    [first] = (await stub.PowerOffRack(power_off("r1"))).task_ids
    await refused(
        db,
        stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=on_racks("r1"))),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"conflicts with task {first.id}",
    )
    queued = await stub.PowerOnRack(
        pb.PowerOnRackRequest(
            target_spec=on_racks("r1"),
            queue_options=pb.QueueOptions(
                conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE, queue_timeout_seconds=120
            ),
        )
    )
    [task] = await tasks_of(stub, queued)
    assert task.status == pb.TASK_STATUS_WAITING
    expires = task.queue_expires_at.ToDatetime() - task.created_at.ToDatetime()
    assert expires == timedelta(seconds=120)
    for _ in range(4):
        await stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=on_racks("r1"), queue_options=QUEUE))
    one_more = pb.PowerOnRackRequest(target_spec=on_racks("r1"), queue_options=QUEUE)
    await refused(db, stub.PowerOnRack(one_more), grpc.StatusCode.FAILED_PRECONDITION, "waiting queue full")


async def test_a_multi_rack_refusal_writes_nothing(db: Database, stub: Stub) -> None:
    await make_rack(stub, "free")
    await make_rack(stub, "busy")
    await stub.PowerOffRack(power_off("busy"))
    await refused(
        db, stub.PowerOffRack(power_off("free", "busy")), grpc.StatusCode.FAILED_PRECONDITION, "busy"
    )


def _ts(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


@pytest.mark.parametrize(
    ("call", "code", "pattern"),
    [
        (lambda s: s.PowerOnRack(pb.PowerOnRackRequest()), grpc.StatusCode.INVALID_ARGUMENT, "target_spec"),
        (
            lambda s: s.PowerOnRack(pb.PowerOnRackRequest(target_spec=on_racks("nope"))),
            grpc.StatusCode.NOT_FOUND,
            "nope",
        ),
        (
            lambda s: s.UpgradeFirmware(pb.UpgradeFirmwareRequest(target_spec=on_racks("r1"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "^target_version",
        ),
        (
            lambda s: s.UpgradeFirmware(
                pb.UpgradeFirmwareRequest(
                    target_spec=on_racks("r1"), target_version="2", start_time=_ts(2000), end_time=_ts(1000)
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "^end_time",
        ),
        (  # a window over before the submit: its task could only fail at its claim, unrun
            lambda s: s.UpgradeFirmware(
                pb.UpgradeFirmwareRequest(target_spec=on_racks("r1"), target_version="2", end_time=_ts(1000))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            r"^end_time: 1970-01-01T00:16:40Z has passed .*the upgrade could never start",
        ),
        (
            lambda s: s.PowerOffRack(power_off("r1", description="x" * 1025)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "^description",
        ),
        (
            lambda s: s.PowerOffRack(
                power_off("r1", queue_options=pb.QueueOptions(queue_timeout_seconds=86401))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "queue_options.queue_timeout_seconds",
        ),
        (
            lambda s: s.PowerOffRack(
                power_off("r1", queue_options=pb.QueueOptions(queue_timeout_seconds=-1))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "queue_options.queue_timeout_seconds",
        ),
        (
            lambda s: s.PowerOffRack(power_off("r1", queue_options=pb.QueueOptions(conflict_strategy=7))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "conflict_strategy",
        ),
        (
            lambda s: s.PowerOnRack(
                pb.PowerOnRackRequest(target_spec=on_racks("r1", types=(pb.COMPONENT_TYPE_CDU,)))
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "r1",
        ),
        (
            lambda s: s.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id="zz")])),
            grpc.StatusCode.INVALID_ARGUMENT,
            r"task_ids\[0\]",
        ),
        (
            lambda s: s.GetTasksByIDs(
                pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=str(uuid.uuid4()))] * 1001)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 1000",
        ),
        (
            lambda s: s.ListTasks(pb.ListTasksRequest(rack_id=pb.UUID(id="bad"))),
            grpc.StatusCode.INVALID_ARGUMENT,
            "rack_id",
        ),
        (lambda s: s.CancelTask(pb.CancelTaskRequest()), grpc.StatusCode.INVALID_ARGUMENT, "task_id"),
        (
            lambda s: s.CancelTask(pb.CancelTaskRequest(task_id=pb.UUID(id=str(uuid.uuid4())))),
            grpc.StatusCode.NOT_FOUND,
            "task_id",
        ),
    ],
)
async def test_bad_requests_get_the_right_code(
    db: Database, stub: Stub, call: Any, code: grpc.StatusCode, pattern: str
) -> None:
    await make_rack(stub)
    await refused(db, call(stub), code, pattern)


async def test_list_tasks_filters_and_pages(stub: Stub, services: Services) -> None:
    r1 = await make_rack(stub, "r1")
    await make_rack(stub, "r2")
    [first] = (await stub.PowerOffRack(power_off("r1"))).task_ids
    [second] = (await stub.PowerOffRack(power_off("r2"))).task_ids
    await stub.CancelTask(pb.CancelTaskRequest(task_id=first))
    listed = await stub.ListTasks(pb.ListTasksRequest())
    assert listed.total == 2 and {t.id.id for t in listed.tasks} == {first.id, second.id}
    assert listed.tasks[0].created_at.ToDatetime() >= listed.tasks[1].created_at.ToDatetime()
    page = await stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(offset=1, limit=1)))
    assert page.total == 2 and [t.id for t in page.tasks] == [listed.tasks[1].id]
    on_r1 = await stub.ListTasks(pb.ListTasksRequest(rack_id=r1.id))
    assert [t.id.id for t in on_r1.tasks] == [first.id]
    active = await stub.ListTasks(pb.ListTasksRequest(active_only=True))
    assert [t.id.id for t in active.tasks] == [second.id] and active.total == 1
    schedule_id = uuid.uuid4()
    [scheduled] = await services.tasks.submit(
        Operation(OperationKind.POWER_ON),
        TargetSpec(racks=(RackTarget(name="r1"),)),
        description="",
        queue=QueueOptions(),
        schedule_id=schedule_id,
    )
    by_schedule = await stub.ListTasks(pb.ListTasksRequest(schedule_id=pb.UUID(id=str(schedule_id))))
    assert [t.id.id for t in by_schedule.tasks] == [str(scheduled.id)]
    assert by_schedule.tasks[0].schedule_id.id == str(schedule_id)


async def test_get_tasks_by_ids_keeps_order_and_skips_unknown(stub: Stub) -> None:
    await make_rack(stub, "r1")
    await make_rack(stub, "r2")
    [a] = (await stub.PowerOffRack(power_off("r1"))).task_ids
    [b] = (await stub.PowerOffRack(power_off("r2"))).task_ids
    found = await stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[b, pb.UUID(id=str(uuid.uuid4())), a]))
    assert [t.id.id for t in found.tasks] == [b.id, a.id]


async def test_cancel_rules(db: Database, stub: Stub, services: Services) -> None:
    await make_rack(stub)
    [task_id] = (await stub.PowerOffRack(power_off("r1"))).task_ids
    cancelled = (await stub.CancelTask(pb.CancelTaskRequest(task_id=task_id))).task
    assert (cancelled.status, cancelled.message) == (pb.TASK_STATUS_TERMINATED, "cancelled by user")
    assert cancelled.HasField("finished_at")
    again = (await stub.CancelTask(pb.CancelTaskRequest(task_id=task_id))).task
    assert again == cancelled
    [done_id] = (await stub.PowerOffRack(power_off("r1"))).task_ids
    async with db.transaction() as conn:
        await store.set_status(conn, [uuid.UUID(done_id.id)], TaskStatus.COMPLETED, now=services.clock.now())
    await refused(
        db,
        stub.CancelTask(pb.CancelTaskRequest(task_id=done_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "completed",
    )


# --- what the backend can tell before any task is made ---------------------------------------------


async def test_an_upgrade_by_version_without_an_image_uri_is_refused_on_redfish(
    db: Database, stub: Stub, services: Services
) -> None:
    """Without RACKFLOW_REDFISH_IMAGE_URI a version maps to no image: every component's SimpleUpdate would
    fail, on every rack; refused up front instead of a task per rack that fails."""
    await make_rack(stub)
    services.tasks.backend = RedfishBackend(RedfishConfig())
    by_version = pb.UpgradeFirmwareRequest(target_spec=on_racks("r1"), target_version="2.4.1")
    await refused(
        db,
        stub.UpgradeFirmware(by_version),
        grpc.StatusCode.FAILED_PRECONDITION,
        r"^target_version: every component's upgrade would fail on this server's redfish backend: "
        r"target_version '2.4.1' is a version, but RACKFLOW_REDFISH_IMAGE_URI .* is not set",
    )
    by_image = pb.UpgradeFirmwareRequest(target_spec=on_racks("r1"), target_version="https://img/bios.bin")
    assert len((await stub.UpgradeFirmware(by_image)).task_ids) == 1  # the image itself needs no template
    await stub.CancelTask(
        pb.CancelTaskRequest(task_id=(await stub.ListTasks(pb.ListTasksRequest())).tasks[0].id)
    )
    services.tasks.backend = RedfishBackend(RedfishConfig(image_uri="https://img/{type}/{version}.bin"))
    assert len((await stub.UpgradeFirmware(by_version)).task_ids) == 1


# --- the converter the schedules API shares --------------------------------------------------------


def test_scheduled_operation_from_reads_the_inner_request() -> None:
    msg = pb.ScheduledOperation(
        upgrade_firmware=pb.UpgradeFirmwareRequest(
            target_spec=on_racks("r1"),
            description="fw",
            target_version="3.0",
            queue_options=pb.QueueOptions(
                conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE, queue_timeout_seconds=60
            ),
        )
    )
    operation, queue, description, target = scheduled_operation_from(msg)
    assert (operation.kind, operation.target_version) == (OperationKind.UPGRADE_FIRMWARE, "3.0")
    assert (queue.strategy, queue.timeout) == (ConflictStrategy.QUEUE, timedelta(seconds=60))
    assert description == "fw" and target == TargetSpec(racks=(RackTarget(name="r1"),))
    off = scheduled_operation_from(pb.ScheduledOperation(power_off=power_off("r1", forced=True)))
    assert off[0].forced and off[1].timeout == timedelta(hours=1)


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (pb.ScheduledOperation(), "^operation: an operation is required"),
        (
            pb.ScheduledOperation(upgrade_firmware=pb.UpgradeFirmwareRequest(target_spec=on_racks("r1"))),
            "^operation.upgrade_firmware.target_version",
        ),
        (pb.ScheduledOperation(power_on=pb.PowerOnRackRequest()), "^operation.power_on.target_spec"),
    ],
)
def test_scheduled_operation_errors_name_the_field(msg: pb.ScheduledOperation, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        scheduled_operation_from(msg)
