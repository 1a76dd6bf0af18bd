"""The 15 schedule RPCs through an in-process gRPC server: shapes, status codes, and refused requests."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select

from rackflow.clock import Clock, FakeClock
from rackflow.domain.audit import EventFilter
from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack
from rackflow.domain.schedules import Pause
from rackflow.domain.tasks import TaskStatus
from rackflow.schedules import firing
from rackflow.schedules import service as schedule_service
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import notification_event
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.conftest import stored_rows, table_counts, write_back_rows

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return FakeClock(START)


async def make_rack(services: Services, name: str) -> Rack:
    types = (ComponentType.COMPUTE, ComponentType.NVSWITCH, ComponentType.POWERSHELF)
    specs = [ComponentSpec(t, f"{name}-{t.value.lower()}") for t in types]
    return await services.inventory.create_rack(name, components=specs)


def racks_spec(*names: str, types: tuple[pb.ComponentType.ValueType, ...] = ()) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(
        racks=pb.RackTargets(targets=[pb.RackTarget(name=n, component_types=types) for n in names])
    )


def power_off(*names: str, description: str = "weekly power cycle") -> pb.ScheduledOperation:
    return pb.ScheduledOperation(
        power_off=pb.PowerOffRackRequest(target_spec=racks_spec(*names), description=description, forced=True)
    )


def config(
    name: str = "nightly",
    spec_type: pb.ScheduleSpecType.ValueType = pb.SCHEDULE_SPEC_TYPE_INTERVAL,
    spec: str = "1h",
    timezone: str = "",
    policy: pb.OverlapPolicy.ValueType = pb.OVERLAP_POLICY_SKIP,
    start_deadline: str = "",
    pause_after_failed_runs: int = 0,
) -> pb.ScheduleConfig:
    return pb.ScheduleConfig(
        name=name,
        spec=pb.ScheduleSpec(type=spec_type, spec=spec, timezone=timezone),
        overlap_policy=policy,
        start_deadline=start_deadline,
        pause_after_failed_runs=pause_after_failed_runs,
    )


async def create(stub: FlowStub, name: str = "nightly", *racks: str, **kwargs: Any) -> pb.TaskSchedule:
    request = pb.CreateTaskScheduleRequest(
        schedule=config(name, **kwargs), operation=power_off(*(racks or ("r1",)))
    )
    schedule: pb.TaskSchedule = await stub.CreateTaskSchedule(request)
    return schedule


async def expect(code: grpc.StatusCode, field: str, call: Awaitable[Any]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert field in (info.value.details() or ""), info.value.details()


def when(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)


@pytest.fixture(scope="module")
def seeded_racks() -> dict[str, tuple[list[Rack], dict[str, Any]]]:
    """`racks` and every table's rows (`stored_rows`) by dialect, once per module and worker: each later
    test's empty database gets the same rows written back, where making the three racks cost each of
    some 200 tests 25 ms of CPU."""
    return {}


@pytest.fixture
async def racks(
    services: Services, db: Database, seeded_racks: dict[str, tuple[list[Rack], dict[str, Any]]]
) -> list[Rack]:
    if (done := seeded_racks.get(db.dialect)) is None:
        made = [await make_rack(services, name) for name in ("r1", "r2", "r3")]
        seeded_racks[db.dialect] = (made, await stored_rows(db))
        return list(made)
    await write_back_rows(db, done[1])
    return list(done[0])


# --- create, get, list ---------------------------------------------------------------------------


async def test_create_returns_the_schedule(stub: FlowStub, racks: list[Rack]) -> None:
    schedule = await create(stub, "nightly", "r1", "r2")
    assert schedule.name == "nightly"
    assert schedule.spec == pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h", timezone="UTC")
    assert schedule.overlap_policy == pb.OVERLAP_POLICY_SKIP
    assert schedule.enabled
    assert when(schedule.next_run_at) == START + timedelta(hours=1)
    assert not schedule.HasField("last_run_at")
    assert schedule.operation_type == "power_off"
    assert schedule.description == "weekly power cycle"
    assert schedule.summary == "Power Off (forced)"
    assert schedule.operation == pb.ScheduledOperation(
        power_off=pb.PowerOffRackRequest(
            description="weekly power cycle",
            forced=True,
            queue_options=pb.QueueOptions(
                conflict_strategy=pb.CONFLICT_STRATEGY_REJECT, queue_timeout_seconds=3600
            ),
        )
    )
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule
    scopes = await stub.ListTaskScheduleScopes(pb.ListTaskScheduleScopesRequest(schedule_id=schedule.id))
    assert {s.rack_id.id for s in scopes.scopes} == {str(racks[0].id), str(racks[1].id)}
    assert all(s.WhichOneof("component_filter") is None for s in scopes.scopes)


async def test_get_and_list_show_what_a_firmware_schedule_runs(stub: FlowStub, racks: list[Rack]) -> None:
    window_start, window_end = Timestamp(), Timestamp()
    window_start.FromDatetime(datetime(2026, 6, 1, 2, 0, tzinfo=UTC))
    window_end.FromDatetime(datetime(2026, 6, 1, 4, 0, tzinfo=UTC))
    firmware = pb.UpgradeFirmwareRequest(
        target_spec=racks_spec("r1", types=(pb.COMPONENT_TYPE_NVSWITCH,)),
        description="switch firmware",
        queue_options=pb.QueueOptions(
            conflict_strategy=pb.CONFLICT_STRATEGY_REJECT, queue_timeout_seconds=900
        ),
        target_version="v2.1.0",
        start_time=window_start,
        end_time=window_end,
    )
    created = await stub.CreateTaskSchedule(
        pb.CreateTaskScheduleRequest(
            schedule=config("fw", policy=pb.OVERLAP_POLICY_QUEUE),
            operation=pb.ScheduledOperation(upgrade_firmware=firmware),
        )
    )
    got = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=created.id))
    (listed,) = (await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest())).task_schedules
    assert got == listed == created
    assert got.summary == ("Upgrade Firmware to v2.1.0 from 2026-06-01T02:00:00Z until 2026-06-01T04:00:00Z")
    assert got.operation_type == "upgrade_firmware"
    stored = got.operation.upgrade_firmware
    assert not stored.HasField("target_spec")  # the racks are the scope
    assert (stored.target_version, stored.description) == ("v2.1.0", "switch firmware")
    assert (stored.start_time, stored.end_time) == (window_start, window_end)
    # The overlap policy, not the request's strategy, decides how each firing queues.
    assert stored.queue_options == pb.QueueOptions(
        conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE, queue_timeout_seconds=900
    )


def firmware_until(end: datetime, name: str = "fw") -> pb.CreateTaskScheduleRequest:
    """A firmware schedule whose upgrade may start only before `end` (its operation's end_time)."""
    end_time = Timestamp()
    end_time.FromDatetime(end)
    upgrade = pb.UpgradeFirmwareRequest(target_spec=racks_spec("r1"), target_version="2.1", end_time=end_time)
    return pb.CreateTaskScheduleRequest(
        schedule=config(name), operation=pb.ScheduledOperation(upgrade_firmware=upgrade)
    )


async def test_a_firmware_schedule_whose_end_time_has_passed_is_refused(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """Every firing's task would be past its window's end when made, and fail at its claim unrun."""
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "operation.upgrade_firmware.end_time: 2026-03-02T11:00:00Z has passed (now 2026-03-02T12:00:00Z): "
        "every firing's upgrade would be too late to start",
        stub.CreateTaskSchedule(firmware_until(START - timedelta(hours=1))),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "operation.upgrade_firmware.end_time: 2026-03-02T12:00:00Z has passed",  # the end is not in it
        stub.CreateTaskSchedule(firmware_until(START)),
    )
    assert await table_counts(services.db) == before


async def test_a_new_spec_for_a_firmware_schedule_past_its_end_time_is_refused(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """UpdateTaskSchedule cannot change the operation; a new spec would give it firings that all fail."""
    assert isinstance(services.clock, FakeClock)
    schedule = await stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=90)))
    services.clock.advance(timedelta(hours=2))
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "schedule.spec: its operation's end_time 2026-03-02T13:30:00Z has passed",
        stub.UpdateTaskSchedule(update(schedule, ["schedule.spec"], spec="2h")),
    )
    assert await table_counts(services.db) == before
    renamed = await stub.UpdateTaskSchedule(update(schedule, ["schedule.name"], name="old-fw"))
    assert renamed.name == "old-fw"  # what does not give it firings is not refused


async def test_a_firmware_schedule_whose_next_firing_is_past_its_end_time_is_refused(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """Its end_time still ahead, but not before the firing it would make next (on create, on a new spec, on
    a resume): that firing and every later one could only be skipped, as a one-time upgrade set after its
    own window would be (accepted, it was recorded skipped and logged, and told nobody)."""
    assert isinstance(services.clock, FakeClock)
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "operation.upgrade_firmware.end_time: the schedule's first firing at 2026-03-02T13:00:00Z is not "
        "before its operation's end_time 2026-03-02T12:30:00Z, so every firing's upgrade would be too late",
        stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=30))),
    )
    one_time = firmware_until(START + timedelta(hours=1), name="fw-once")
    one_time.schedule.spec.CopyFrom(
        pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2026-03-02T14:00:00Z")
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "the schedule's first firing at 2026-03-02T14:00:00Z is not before",
        stub.CreateTaskSchedule(one_time),
    )
    assert await table_counts(services.db) == before

    schedule = await stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=90)))  # fires at 13:00
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "schedule.spec: its next firing at 2026-03-02T14:00:00Z is not before its operation's end_time "
        "2026-03-02T13:30:00Z",
        stub.UpdateTaskSchedule(update(schedule, ["schedule.spec"], spec="2h")),
    )
    assert await table_counts(services.db) == before
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    services.clock.advance(timedelta(minutes=40))  # resumed now, it would first fire at 13:40
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "id: schedule 'fw' cannot be resumed: its next firing at 2026-03-02T13:40:00Z is not before",
        stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=schedule.id)),
    )
    assert not (await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))).enabled


async def _paused_events(services: Services) -> int:
    async with services.db.read() as conn:
        stmt = select(func.count()).where(notification_event.c.type == "schedule.paused")
        return int((await conn.execute(stmt)).scalar_one())


async def test_a_firmware_schedule_past_its_end_time_fires_nothing_and_is_paused_once(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """Its tasks could only fail unrun: the dispatcher's first firing past the end_time makes none, records
    the slot skipped with the reason, and pauses the schedule by rackflow with it, once (audited, one
    schedule.paused event); a resume or a trigger, which cannot change the end_time, is refused."""
    assert isinstance(services.clock, FakeClock)
    schedule = await stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=90)))
    dispatcher = Dispatcher(services.schedules, services.audit)
    services.clock.advance(timedelta(hours=1))
    assert await dispatcher.poll_once() == 1  # within its window: fires as before
    services.clock.advance(timedelta(hours=1))

    assert await dispatcher.poll_once() == 0

    ended = "its firmware window ended at 2026-03-02T13:30:00Z (its upgrade's end_time)"
    runs = await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    assert [(r.state, r.trigger) for r in runs.runs] == [("skipped", "dispatch"), ("completed", "dispatch")]
    assert runs.runs[0].reason.startswith(ended) and list(runs.runs[0].outcomes) == []
    assert when(runs.runs[0].scheduled_for) == START + timedelta(hours=2)
    assert (await stub.ListTasks(pb.ListTasksRequest())).total == 1
    paused = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert not paused.enabled and paused.pause_reason == runs.runs[0].reason
    assert (paused.paused_by, when(paused.paused_at)) == ("rackflow", START + timedelta(hours=2))
    (event,), _ = await services.audit.list_events(
        EventFilter(method="PauseTaskSchedule"), offset=0, limit=10
    )
    assert (event.principal, event.target_ids) == ("rackflow", (schedule.id.id, runs.runs[0].id.id))
    assert event.request["reason"] == paused.pause_reason
    assert await _paused_events(services) == 1

    services.clock.advance(timedelta(hours=3))
    assert await dispatcher.poll_once() == 0  # paused: no run each slot, no notification each slot
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "id: schedule 'fw' cannot be resumed: its operation's end_time 2026-03-02T13:30:00Z has passed",
        stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=schedule.id)),
    )
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"not fired: {ended}",
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id)),
    )
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == paused
    assert (
        await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    ).total == 2
    assert await _paused_events(services) == 1


def _pause_until(schedule: pb.TaskSchedule, resume_at: datetime) -> pb.PauseTaskScheduleRequest:
    request = pb.PauseTaskScheduleRequest(id=schedule.id, reason="rack move")
    request.resume_at.FromDatetime(resume_at)
    return request


async def test_a_pause_of_a_firmware_schedule_may_not_end_past_its_end_time(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """Resumed then, the schedule's next firing could only be skipped and pause it again (a second
    notification for nothing): a resume_at at or past the end_time, or one whose next firing would be, is
    refused, writing nothing; one whose next firing is still inside the window is not."""
    schedule = await stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=90)))
    window_end = "its firmware window's end at 2026-03-02T13:30:00Z (its upgrade's end_time)"
    for resume_at, refusal in (
        (START + timedelta(hours=2), f"{window_end} is not after 2026-03-02T14:00:00Z"),
        (START + timedelta(minutes=90), f"{window_end} is not after 2026-03-02T13:30:00Z"),  # the end itself
        (
            START + timedelta(minutes=40),  # its next firing is an hour after the resume: past the end
            "its next firing once resumed at 2026-03-02T12:40:00Z would be at 2026-03-02T13:40:00Z, not "
            f"before {window_end}",
        ),
    ):
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"resume_at: {refusal}, so every firing's upgrade would be too late to start",
            stub.PauseTaskSchedule(_pause_until(schedule, resume_at)),
        )
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule
    paused = await stub.PauseTaskSchedule(_pause_until(schedule, START + timedelta(minutes=20)))
    assert when(paused.resume_at) == START + timedelta(minutes=20)  # resumed, it fires at 13:20


async def test_a_pause_that_ends_past_a_firmware_schedules_end_time_keeps_it_paused_once(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """A pause with such a resume_at made before it was refused does not resume the schedule at its end
    (its next firing would only be skipped, and pause it again: two notifications for nothing): the
    schedule stays paused, by rackflow, saying why, without the end; audited and notified once."""
    assert isinstance(services.clock, FakeClock)
    schedule = await stub.CreateTaskSchedule(firmware_until(START + timedelta(minutes=90)))
    async with services.db.transaction() as conn:  # as an earlier release let an operator pause it
        stored = await schedule_store.get_schedule(conn, uuid.UUID(schedule.id.id))
        assert stored is not None
        pause = Pause("rack move", "ann", START, resume_at=START + timedelta(hours=2))
        await schedule_store.save_schedule(conn, replace(stored, enabled=False, pause=pause))
    dispatcher = Dispatcher(services.schedules, services.audit)
    services.clock.advance(timedelta(hours=2))

    await dispatcher.resume_ended_pauses()

    kept = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert not kept.enabled and not kept.HasField("resume_at")
    assert kept.paused_by == "rackflow"
    assert kept.pause_reason.startswith(
        "its pause ended at 2026-03-02T14:00:00Z: its firmware window's end at 2026-03-02T13:30:00Z (its "
        "upgrade's end_time) is not after 2026-03-02T14:00:00Z, so every firing's upgrade would be too "
        "late to start and be skipped; it stays paused"
    )
    (event,), _ = await services.audit.list_events(
        EventFilter(method="PauseTaskSchedule"), offset=0, limit=10
    )
    assert (event.principal, event.target_ids) == ("rackflow", (schedule.id.id,))
    assert event.request["reason"] == kept.pause_reason
    assert event.request["pause_ended"]["by"] == "ann"
    assert (await services.audit.list_events(EventFilter(method="ResumeTaskSchedule"), offset=0, limit=10))[
        0
    ] == []
    assert await _paused_events(services) == 1
    services.clock.advance(timedelta(hours=1))
    await dispatcher.resume_ended_pauses()
    assert await dispatcher.poll_once() == 0
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == kept
    assert await _paused_events(services) == 1
    assert (
        await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    ).total == 0


async def test_a_firmware_schedule_by_version_without_an_image_uri_is_refused_on_redfish(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """Every firing's upgrade would fail on every component: the backend cannot map a version to an image."""
    services.tasks.backend = RedfishBackend(RedfishConfig())
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "operation.upgrade_firmware.target_version: every component's upgrade would fail on this server's "
        "redfish backend: target_version '2.1' is a version, but RACKFLOW_REDFISH_IMAGE_URI",
        stub.CreateTaskSchedule(firmware_until(START + timedelta(days=1))),
    )
    assert await table_counts(services.db) == before


BAD_CONFIGS = [
    ({"spec_type": pb.SCHEDULE_SPEC_TYPE_UNSPECIFIED}, "schedule.spec.type"),
    ({"spec_type": 42}, "schedule.spec.type"),
    ({"policy": 7}, "schedule.overlap_policy"),
    ({"spec": "1d"}, "schedule.spec.spec"),
    ({"spec": "0"}, "schedule.spec.spec"),
    ({"spec_type": pb.SCHEDULE_SPEC_TYPE_CRON, "spec": "0 2 * *"}, "schedule.spec.spec"),
    (
        {"spec_type": pb.SCHEDULE_SPEC_TYPE_CRON, "spec": "0 2 * * *", "timezone": "EST5EDTX"},
        "schedule.spec.timezone",
    ),
    ({"spec_type": pb.SCHEDULE_SPEC_TYPE_ONE_TIME, "spec": "2026-06-01 04:00"}, "schedule.spec.spec"),
    ({"name": ""}, "schedule.name"),
    ({"name": "a\x00b"}, "schedule.name"),
    ({"start_deadline": "15"}, "schedule.start_deadline"),
    ({"start_deadline": "-1m"}, "schedule.start_deadline"),
    ({"start_deadline": "100ms"}, "schedule.start_deadline"),
    ({"pause_after_failed_runs": -1}, "schedule.pause_after_failed_runs"),
    ({"pause_after_failed_runs": 1000}, "schedule.pause_after_failed_runs"),
]


@pytest.mark.parametrize(("overrides", "field"), BAD_CONFIGS)
async def test_bad_create_is_invalid_argument_and_writes_nothing(
    stub: FlowStub, services: Services, racks: list[Rack], overrides: dict[str, Any], field: str
) -> None:
    before = await table_counts(services.db)
    kwargs = {"name": "n", **overrides}
    name = kwargs.pop("name")
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, create(stub, name, "r1", **kwargs))
    assert await table_counts(services.db) == before


async def test_bad_create_targets_and_operations(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    before = await table_counts(services.db)
    no_operation = pb.CreateTaskScheduleRequest(schedule=config())
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "operation", stub.CreateTaskSchedule(no_operation))
    empty_target = pb.CreateTaskScheduleRequest(
        schedule=config(), operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest())
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "target_spec", stub.CreateTaskSchedule(empty_target))
    await expect(grpc.StatusCode.NOT_FOUND, "target_spec", create(stub, "n", "nope"))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "target_spec", create(stub, "n", "r1", "r1"))
    assert await table_counts(services.db) == before


async def test_duplicate_name_is_already_exists(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    await create(stub, "dup")
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.ALREADY_EXISTS, "schedule.name", create(stub, "dup"))
    assert await table_counts(services.db) == before


async def test_get_with_bad_or_unknown_id(stub: FlowStub) -> None:
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", stub.GetTaskSchedule(pb.GetTaskScheduleRequest()))
    bad = pb.GetTaskScheduleRequest(id=pb.UUID(id="not-a-uuid"))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "not-a-uuid", stub.GetTaskSchedule(bad))
    unknown = pb.GetTaskScheduleRequest(id=pb.UUID(id="00000000-0000-0000-0000-000000000001"))
    await expect(grpc.StatusCode.NOT_FOUND, "id", stub.GetTaskSchedule(unknown))


async def test_list_filters_pages_and_counts(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    assert isinstance(services.clock, FakeClock)
    for index, rack in enumerate(["r1", "r2", "r1", "r3"]):
        await create(stub, f"s{index}", rack)
        services.clock.advance(timedelta(seconds=1))
    s2 = (await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest())).task_schedules[2]
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=s2.id))

    everything = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest())
    assert [s.name for s in everything.task_schedules] == ["s0", "s1", "s2", "s3"] and everything.total == 4
    page = await stub.ListTaskSchedules(
        pb.ListTaskSchedulesRequest(pagination=pb.Pagination(offset=1, limit=2))
    )
    assert [s.name for s in page.task_schedules] == ["s1", "s2"] and page.total == 4
    on_r1 = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(rack_id=pb.UUID(id=str(racks[0].id))))
    assert [s.name for s in on_r1.task_schedules] == ["s0", "s2"] and on_r1.total == 2
    enabled = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(enabled_only=True))
    assert [s.name for s in enabled.task_schedules] == ["s0", "s1", "s3"] and enabled.total == 3
    bad_page = pb.ListTaskSchedulesRequest(pagination=pb.Pagination(offset=-1))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "pagination.offset", stub.ListTaskSchedules(bad_page))
    bad_rack = pb.ListTaskSchedulesRequest(rack_id=pb.UUID(id="x"))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "rack_id", stub.ListTaskSchedules(bad_rack))


async def test_a_list_longer_than_a_chunk_streams_every_schedule_in_order(
    stub: FlowStub, services: Services, racks: list[Rack], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_store, "LIST_CHUNK", 3)  # 8 schedules: chunks of 3, 3 and 2
    assert isinstance(services.clock, FakeClock)
    for index in range(8):
        await create(stub, f"s{index}", "r1")
        services.clock.advance(timedelta(seconds=1))
    everything = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest())
    assert [s.name for s in everything.task_schedules] == [
        f"s{i}" for i in range(8)
    ] and everything.total == 8
    newest = await stub.ListTaskSchedules(
        pb.ListTaskSchedulesRequest(order_by="name desc", pagination=pb.Pagination(offset=1, limit=4))
    )
    assert [s.name for s in newest.task_schedules] == ["s6", "s5", "s4", "s3"] and newest.total == 8
    chunks: list[int] = []
    listed = await services.schedules.each_schedule_chunk(lambda chunk: chunks.append(len(chunk)))
    assert (chunks, listed.total) == ([3, 3, 2], 8)


# --- update, pause, resume, delete ---------------------------------------------------------------


def update(schedule: pb.TaskSchedule, paths: list[str], **kwargs: Any) -> pb.UpdateTaskScheduleRequest:
    return pb.UpdateTaskScheduleRequest(
        id=schedule.id, schedule=config(**kwargs), update_mask=FieldMask(paths=paths)
    )


async def test_update_each_mask_path(stub: FlowStub, racks: list[Rack]) -> None:
    schedule = await create(stub, "s", "r1")
    renamed = await stub.UpdateTaskSchedule(update(schedule, ["schedule.name"], name="renamed"))
    assert renamed.name == "renamed" and renamed.next_run_at == schedule.next_run_at
    queued = await stub.UpdateTaskSchedule(
        update(schedule, ["schedule.overlap_policy"], name="", policy=pb.OVERLAP_POLICY_QUEUE)
    )
    assert queued.overlap_policy == pb.OVERLAP_POLICY_QUEUE and queued.name == "renamed"
    cron = await stub.UpdateTaskSchedule(
        update(schedule, ["schedule.spec"], spec_type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 14 * * *")
    )
    assert cron.spec == pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 14 * * *", timezone="UTC")
    assert when(cron.next_run_at) == datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    # Only the timezone is masked, so the unset spec type in the request is not read.
    tokyo = await stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(
            id=schedule.id,
            schedule=pb.ScheduleConfig(spec=pb.ScheduleSpec(timezone="Asia/Tokyo")),
            update_mask=FieldMask(paths=["schedule.spec.timezone"]),
        )
    )
    assert tokyo.spec == pb.ScheduleSpec(
        type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 14 * * *", timezone="Asia/Tokyo"
    )
    assert when(tokyo.next_run_at) == datetime(2026, 3, 3, 5, 0, tzinfo=UTC)


def timezone_only(schedule: pb.TaskSchedule, spec: pb.ScheduleSpec | None) -> pb.UpdateTaskScheduleRequest:
    return pb.UpdateTaskScheduleRequest(
        id=schedule.id,
        schedule=pb.ScheduleConfig(spec=spec),
        update_mask=FieldMask(paths=["schedule.spec.timezone"]),
    )


async def test_update_timezone_only_keeps_an_interval_next_run(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    assert isinstance(services.clock, FakeClock)
    schedule = await create(stub, "s", "r1")
    services.clock.advance(timedelta(minutes=40))
    tokyo = await stub.UpdateTaskSchedule(timezone_only(schedule, pb.ScheduleSpec(timezone="Asia/Tokyo")))
    assert tokyo.spec.timezone == "Asia/Tokyo" and tokyo.next_run_at == schedule.next_run_at
    utc = await stub.UpdateTaskSchedule(timezone_only(schedule, pb.ScheduleSpec()))  # spec {}: UTC
    assert utc.spec.timezone == "UTC" and utc.next_run_at == schedule.next_run_at


async def test_update_timezone_without_a_spec_message_is_invalid_and_writes_nothing(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    schedule = await create(stub, "s", "r1")
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "schedule.spec: ",
        stub.UpdateTaskSchedule(timezone_only(schedule, None)),
    )
    assert await table_counts(services.db) == before
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule


BAD_UPDATES = [
    ([], {}, "update_mask"),
    (["schedule.operation"], {}, "schedule.operation"),
    (["schedule.spec"], {"spec_type": pb.SCHEDULE_SPEC_TYPE_UNSPECIFIED}, "schedule.spec.type"),
    (["schedule.spec"], {"spec_type": pb.SCHEDULE_SPEC_TYPE_INTERVAL, "spec": "-5m"}, "schedule.spec.spec"),
    (["schedule.spec.timezone"], {"timezone": "Local"}, "schedule.spec.timezone"),
    (["schedule.overlap_policy"], {"policy": 3}, "schedule.overlap_policy"),
    (["schedule.name"], {"name": ""}, "schedule.name"),
    (["schedule.start_deadline"], {"start_deadline": "soon"}, "schedule.start_deadline"),
    (
        ["schedule.pause_after_failed_runs"],
        {"pause_after_failed_runs": 101},
        "schedule.pause_after_failed_runs",
    ),
]


async def test_the_start_deadline_and_pause_after_failed_runs_round_trip(
    stub: FlowStub, racks: list[Rack]
) -> None:
    schedule = await create(stub, "s", "r1", start_deadline="15m", pause_after_failed_runs=3)
    assert (schedule.start_deadline, schedule.pause_after_failed_runs) == ("15m", 3)
    none = await stub.UpdateTaskSchedule(update(schedule, ["schedule.start_deadline"], start_deadline="0s"))
    assert (none.start_deadline, none.pause_after_failed_runs) == ("0s", 3)  # none, whatever the default
    unset = await stub.UpdateTaskSchedule(
        update(schedule, ["schedule.start_deadline", "schedule.pause_after_failed_runs"])
    )
    assert (unset.start_deadline, unset.pause_after_failed_runs) == ("", 0)


async def test_the_preview_as_if_resumed_shows_the_missed_slot(stub: FlowStub, racks: list[Rack]) -> None:
    one_time = {"spec_type": pb.SCHEDULE_SPEC_TYPE_ONE_TIME, "spec": "2026-03-02T13:00:00Z"}
    schedule = await create(stub, "s", "r1", start_deadline="30m", **one_time)
    late = Timestamp()
    late.FromDatetime(datetime(2026, 3, 2, 14, 0))
    preview = await stub.PreviewTaskSchedule(
        pb.PreviewTaskScheduleRequest(id=schedule.id, count=2, resume_at=late)
    )
    paused, resumed = preview.firings
    assert [s.decision for s in paused.scopes] == ["paused"] and not paused.would_be_missed
    assert [s.decision for s in resumed.scopes] == ["missed"] and resumed.would_be_missed
    on_time = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=1))
    assert not on_time.firings[0].would_be_missed
    draft = pb.CreateTaskScheduleRequest(schedule=config("d"), operation=power_off("r1"))
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "resume_at",
        stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(draft=draft, resume_at=late)),
    )


@pytest.mark.parametrize(("paths", "values", "field"), BAD_UPDATES)
async def test_bad_update_is_invalid_argument_and_changes_nothing(
    stub: FlowStub, racks: list[Rack], paths: list[str], values: dict[str, Any], field: str
) -> None:
    schedule = await create(stub, "s", "r1")
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT, field, stub.UpdateTaskSchedule(update(schedule, paths, **values))
    )
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule


async def test_rename_collision_applies_nothing(stub: FlowStub, racks: list[Rack]) -> None:
    await create(stub, "taken", "r1")
    schedule = await create(stub, "mine", "r1")
    request = update(
        schedule,
        ["schedule.overlap_policy", "schedule.name", "schedule.spec"],
        name="taken",
        policy=pb.OVERLAP_POLICY_QUEUE,
        spec="5m",
    )
    await expect(grpc.StatusCode.ALREADY_EXISTS, "taken", stub.UpdateTaskSchedule(request))
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule


def _timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


async def test_pause_with_a_reason_and_an_end_shows_them_until_resumed(
    stub: FlowStub, racks: list[Rack]
) -> None:
    schedule = await create(stub, "nightly", "r1")
    resume_at = START + timedelta(hours=2)
    request = pb.PauseTaskScheduleRequest(id=schedule.id, reason="PSU swap, INC-4411")
    request.resume_at.CopyFrom(_timestamp(resume_at))
    paused = await stub.PauseTaskSchedule(request)
    assert not paused.enabled
    assert paused.pause_reason == "PSU swap, INC-4411"
    assert paused.paused_by == ""  # anonymous: no principal to name
    assert when(paused.paused_at) == START and when(paused.resume_at) == resume_at
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == paused
    resumed = await stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=schedule.id))
    assert resumed.enabled and resumed.pause_reason == ""
    assert not resumed.HasField("paused_at") and not resumed.HasField("resume_at")


@pytest.mark.parametrize(
    ("reason", "resume_at", "field"),
    [
        ("", START, "resume_at"),
        ("", START - timedelta(hours=1), "resume_at"),
        # Stored, a pause ending in year 9999 made every preview of the schedule an INTERNAL error.
        ("", datetime(9999, 12, 31, 23, 59, 29, tzinfo=UTC), "resume_at"),
        ("x" * 1025, None, "reason"),
        ("bad\x00reason", None, "reason"),
    ],
)
async def test_bad_pause_requests_are_invalid_and_write_nothing(
    stub: FlowStub, racks: list[Rack], reason: str, resume_at: datetime | None, field: str
) -> None:
    schedule = await create(stub, "nightly", "r1")
    request = pb.PauseTaskScheduleRequest(id=schedule.id, reason=reason)
    if resume_at is not None:
        request.resume_at.CopyFrom(_timestamp(resume_at))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: ", stub.PauseTaskSchedule(request))
    assert await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)) == schedule


async def test_a_preview_past_year_9999_ends_there(stub: FlowStub, racks: list[Rack]) -> None:
    """An interval schedule previewed from the edge of year 9999 overflowed: INTERNAL. Its times end there."""
    schedule = await create(stub, "hourly", "r1")
    request = pb.PreviewTaskScheduleRequest(id=schedule.id, count=5)
    request.after.CopyFrom(_timestamp(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)))
    preview = await stub.PreviewTaskSchedule(request)
    assert list(preview.firings) == []


async def test_pause_resume_and_one_time_consumption(stub: FlowStub, racks: list[Rack]) -> None:
    once = await create(
        stub, "once", "r1", spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2026-03-02T15:00:00+01:00"
    )
    assert when(once.next_run_at) == datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    paused = await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=once.id))
    assert not paused.enabled
    assert await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=once.id)) == paused
    resumed = await stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=once.id))
    assert resumed.enabled and resumed.next_run_at == once.next_run_at

    fired = await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id))
    assert len(fired.task_ids) == 1
    consumed = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=once.id))
    assert (
        not consumed.enabled and not consumed.HasField("next_run_at") and when(consumed.last_run_at) == START
    )
    for call in (
        stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=once.id)),
        stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=once.id)),
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id)),
        stub.UpdateTaskSchedule(
            update(
                consumed,
                ["schedule.spec"],
                spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME,
                spec="2027-01-01T00:00:00Z",
            )
        ),
    ):
        await expect(grpc.StatusCode.FAILED_PRECONDITION, "already fired", call)


@pytest.mark.parametrize(
    ("policy", "busy"), [(pb.OVERLAP_POLICY_SKIP, "skip_overlap"), (pb.OVERLAP_POLICY_QUEUE, "fire")]
)
async def test_the_preview_predicts_the_overlap_skip(
    stub: FlowStub, services: Services, racks: list[Rack], policy: pb.OverlapPolicy.ValueType, busy: str
) -> None:
    """A scope whose last task is still active is skipped by a dispatched firing under overlap SKIP: the
    preview says so at every time while that task runs, and the dispatcher then records just that."""
    schedule = await create(stub, "s", "r1", "r2", policy=policy)
    fired = await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    tasks = await services.tasks.get_tasks([uuid.UUID(t.id) for t in fired.task_ids])
    done = [t.id for t in tasks if t.rack_id == racks[1].id]  # r2's task ended, r1's still runs
    async with services.db.transaction() as conn:
        await task_store.set_status(conn, done, TaskStatus.COMPLETED, now=START)

    preview = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=3))

    rows = [sorted((d.rack_name, d.decision) for d in f.scopes) for f in preview.firings]
    assert rows == [[("r1", busy), ("r2", "fire")]] * 3
    at = when(preview.firings[0].at)
    async with services.db.transaction() as conn:
        locked = await schedule_store.get_schedule(
            conn, uuid.UUID(schedule.id.id), lock=services.db.for_update
        )
        assert locked is not None
        claimed = await firing.claim(services.db, conn, [locked], trigger="dispatch", now=at)
    (result,) = await firing.fire(services.db, services.tasks, services.clock, claimed)
    outcomes = {o.rack_id: o.outcome for o in result.outcomes}
    expected = {"skip_overlap": "skipped_overlap", "fire": "submitted"}
    assert outcomes == {racks[0].id: expected[busy], racks[1].id: "submitted"}


async def test_trigger_and_delete(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    schedule = await create(stub, "s", "r1", "r2")
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    fired = await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    assert len(fired.task_ids) == 2
    after = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert not after.enabled and when(after.last_run_at) == START

    runs = await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    assert runs.total == 1
    (run,) = runs.runs
    assert (run.trigger, run.state, when(run.fired_at)) == ("manual", "completed", START)
    assert {o.task_id.id for o in run.outcomes} == {t.id for t in fired.task_ids}
    assert {o.outcome for o in run.outcomes} == {"submitted"}

    await stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=schedule.id))
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    )
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=schedule.id))
    )
    tasks = await services.tasks.get_tasks([uuid.UUID(t.id) for t in fired.task_ids])
    assert [t.status.value for t in tasks] == ["pending", "pending"]
    counts = await table_counts(services.db)
    assert counts["task_schedule_scope"] == counts["task_schedule_run"] == 0


async def test_a_trigger_that_submits_nothing_is_failed_precondition_and_still_recorded(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    once = await create(
        stub, "once", "r1", "r2", spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2026-06-01T04:00:00Z"
    )
    for rack in racks[:2]:  # bring-up owns the rack: the power-off of each scope is refused
        target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(id=uuid_of(rack))]))
        await stub.BringUpRack(pb.BringUpRackRequest(target_spec=target))

    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "submitted no task",
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id)),
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id))
    assert "already fired" in (refused.value.details() or "")  # the failed trigger consumed it

    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=once.id))).runs
    assert [o.outcome for o in run.outcomes] == ["failed", "failed"]
    consumed = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=once.id))
    assert not consumed.enabled and not consumed.HasField("next_run_at")


async def test_the_refusal_names_each_rack_and_its_reason(stub: FlowStub, racks: list[Rack]) -> None:
    schedule = await create(stub, "s", "r1", "r2")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))  # both racks now busy
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.details() or ""
    for rack in racks[:2]:
        assert f"rack {rack.name!r} ({rack.id}): power_off conflicts with task" in message
    assert "r3" not in message


def uuid_of(rack: Rack) -> pb.UUID:
    return pb.UUID(id=str(rack.id))


# --- scope ---------------------------------------------------------------------------------------


async def test_scope_rpcs(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    compute, nvswitch = pb.COMPONENT_TYPE_COMPUTE, pb.COMPONENT_TYPE_NVSWITCH
    request = pb.CreateTaskScheduleRequest(
        schedule=config("s"),
        operation=pb.ScheduledOperation(
            power_on=pb.PowerOnRackRequest(target_spec=racks_spec("r1", types=(compute,)))
        ),
    )
    schedule = await stub.CreateTaskSchedule(request)
    added = await stub.AddTaskScheduleScope(
        pb.AddTaskScheduleScopeRequest(
            schedule_id=schedule.id, target_spec=racks_spec("r1", "r2", types=(nvswitch,))
        )
    )
    by_rack = {s.rack_id.id: s for s in added.scopes}
    assert list(by_rack[str(racks[0].id)].types.types) == [compute, nvswitch]
    assert list(by_rack[str(racks[1].id)].types.types) == [nvswitch]

    component = racks[0].components[0]
    mixed = pb.OperationTargetSpec(
        components=pb.ComponentTargets(targets=[pb.ComponentTarget(id=pb.UUID(id=str(component.id)))])
    )
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        str(racks[0].id),
        stub.AddTaskScheduleScope(pb.AddTaskScheduleScopeRequest(schedule_id=schedule.id, target_spec=mixed)),
    )
    assert await table_counts(services.db) == before

    updated = await stub.UpdateTaskScheduleScope(
        pb.UpdateTaskScheduleScopeRequest(schedule_id=schedule.id, desired_scope=mixed)
    )
    assert (updated.added, updated.removed, updated.updated) == (0, 1, 1)
    (only,) = updated.scopes
    assert [t.id.id for t in only.components.targets] == [str(component.id)]

    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "delete the schedule instead",
        stub.RemoveTaskScheduleScope(pb.RemoveTaskScheduleScopeRequest(scope_id=only.id)),
    )
    grown = await stub.AddTaskScheduleScope(
        pb.AddTaskScheduleScopeRequest(schedule_id=schedule.id, target_spec=racks_spec("r3"))
    )
    assert len(grown.scopes) == 2
    await stub.RemoveTaskScheduleScope(pb.RemoveTaskScheduleScopeRequest(scope_id=only.id))
    listed = await stub.ListTaskScheduleScopes(pb.ListTaskScheduleScopesRequest(schedule_id=schedule.id))
    assert [s.rack_id.id for s in listed.scopes] == [str(racks[2].id)]
    assert listed.scopes[0].WhichOneof("component_filter") is None
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "scope_id",
        stub.RemoveTaskScheduleScope(pb.RemoveTaskScheduleScopeRequest(scope_id=only.id)),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "desired_scope",
        stub.UpdateTaskScheduleScope(pb.UpdateTaskScheduleScopeRequest(schedule_id=schedule.id)),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "schedule_id",
        stub.ListTaskScheduleScopes(pb.ListTaskScheduleScopesRequest()),
    )


@pytest.mark.parametrize(
    ("targets", "code", "error"),
    [
        (
            racks_spec("r1", "r2", "r1"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "desired_scope.racks[2]: rack with name 'r1' is listed twice (also desired_scope.racks[0])",
        ),
        (racks_spec("r2", "r9"), grpc.StatusCode.NOT_FOUND, "desired_scope.racks[1]: no rack with name 'r9'"),
    ],
    ids=["listed-twice", "not-found"],
)
async def test_update_scope_names_the_target_under_desired_scope(
    stub: FlowStub,
    services: Services,
    racks: list[Rack],
    targets: pb.OperationTargetSpec,
    code: grpc.StatusCode,
    error: str,
) -> None:
    """UpdateTaskScheduleScope's targets are its request's `desired_scope`, as AddTaskScheduleScope's are
    its `target_spec`: a target that does not resolve is named by its path in the request."""
    schedule = await create(stub, "s", "r1")
    before = await table_counts(services.db)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpdateTaskScheduleScope(
            pb.UpdateTaskScheduleScopeRequest(schedule_id=schedule.id, desired_scope=targets)
        )
    assert (info.value.code(), info.value.details()) == (code, error)
    assert await table_counts(services.db) == before


# --- advisory ------------------------------------------------------------------------------------


async def test_check_conflicts(stub: FlowStub, racks: list[Rack]) -> None:
    first = await create(stub, "first", "r1")
    await create(stub, "elsewhere", "r3")
    response = await stub.CheckScheduleConflicts(
        pb.CheckScheduleConflictsRequest(operation=power_off("r1", "r2"))
    )
    assert [s.id for s in response.conflicts] == [first.id]
    excluded = await stub.CheckScheduleConflicts(
        pb.CheckScheduleConflictsRequest(operation=power_off("r1"), exclude_schedule_id=first.id)
    )
    assert list(excluded.conflicts) == []
    # Another operation the conflict rules could refuse beside it: reported, component filters ignored.
    firmware = pb.ScheduledOperation(
        upgrade_firmware=pb.UpgradeFirmwareRequest(
            target_spec=racks_spec("r1", types=(pb.COMPONENT_TYPE_NVSWITCH,)), target_version="v2.1.0"
        )
    )
    other_kind = await stub.CheckScheduleConflicts(pb.CheckScheduleConflictsRequest(operation=firmware))
    assert [s.id for s in other_kind.conflicts] == [first.id]
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "exclude_schedule_id",
        stub.CheckScheduleConflicts(
            pb.CheckScheduleConflictsRequest(operation=power_off("r1"), exclude_schedule_id=pb.UUID(id="zz"))
        ),
    )


def preview(
    spec_type: pb.ScheduleSpecType.ValueType,
    spec: str,
    count: int = 0,
    timezone: str = "",
    after: datetime | None = None,
) -> pb.PreviewScheduleSpecRequest:
    request = pb.PreviewScheduleSpecRequest(
        spec=pb.ScheduleSpec(type=spec_type, spec=spec, timezone=timezone), count=count
    )
    if after is not None:
        request.after.FromDatetime(after)
    return request


async def test_preview_each_type(stub: FlowStub) -> None:
    interval = await stub.PreviewScheduleSpec(preview(pb.SCHEDULE_SPEC_TYPE_INTERVAL, "30m", 3))
    assert [when(t) for t in interval.times] == [START + timedelta(minutes=30 * n) for n in (1, 2, 3)]
    default_count = await stub.PreviewScheduleSpec(preview(pb.SCHEDULE_SPEC_TYPE_INTERVAL, "30m"))
    assert len(default_count.times) == 10
    after = datetime(2026, 7, 1, 6, 0, tzinfo=UTC)
    cron = await stub.PreviewScheduleSpec(preview(pb.SCHEDULE_SPEC_TYPE_CRON, "0 6 * * 1-5", 2, "UTC", after))
    assert [when(t) for t in cron.times] == [
        datetime(2026, 7, 2, 6, 0, tzinfo=UTC),
        datetime(2026, 7, 3, 6, 0, tzinfo=UTC),
    ]
    once = await stub.PreviewScheduleSpec(preview(pb.SCHEDULE_SPEC_TYPE_ONE_TIME, "2001-02-03T04:05:06Z"))
    assert [when(t) for t in once.times] == [datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("request_args", "field"),
    [
        ((pb.SCHEDULE_SPEC_TYPE_INTERVAL, "1h", 101), "count"),
        ((pb.SCHEDULE_SPEC_TYPE_INTERVAL, "1h", -3), "count"),
        ((pb.SCHEDULE_SPEC_TYPE_UNSPECIFIED, "1h"), "spec.type"),
        ((pb.SCHEDULE_SPEC_TYPE_INTERVAL, "fast"), "spec.spec"),
        ((pb.SCHEDULE_SPEC_TYPE_CRON, "0 2 * * *", 1, "Atlantis/Capital"), "spec.timezone"),
    ],
)
async def test_preview_rejects_what_create_rejects(
    stub: FlowStub, request_args: tuple[Any, ...], field: str
) -> None:
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, stub.PreviewScheduleSpec(preview(*request_args)))


async def test_the_basic_view_counts_what_the_full_view_lists(stub: FlowStub, racks: list[Rack]) -> None:
    """ListTaskScheduleRuns' BASIC view: each run as FULL gives it, less its outcomes (and progress), with
    its racks counted by outcome (and with a task) and its tasks by status instead; FULL is the default,
    and a view that is neither is refused naming the field."""
    schedule = await create(stub, "counted", "r1", "r2", "r3")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    # The second firing conflicts with the first's pending tasks: recorded, its racks failed without a task.
    trigger = stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    await expect(grpc.StatusCode.FAILED_PRECONDITION, "submitted no task", trigger)

    def listed(view: pb.TaskScheduleRunView.ValueType) -> Any:
        return stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id, view=view))

    unset = await listed(pb.TASK_SCHEDULE_RUN_VIEW_UNSPECIFIED)
    full = await listed(pb.TASK_SCHEDULE_RUN_VIEW_FULL)
    basic = await listed(pb.TASK_SCHEDULE_RUN_VIEW_BASIC)
    assert unset == full and len(full.runs) == 2 and basic.total == full.total
    for whole, counted in zip(full.runs, basic.runs, strict=True):
        assert not counted.outcomes and not counted.HasField("progress")
        assert not whole.outcome_counts and not whole.task_counts
        bare = pb.TaskScheduleRun()
        bare.CopyFrom(whole)
        del bare.outcomes[:]
        bare.ClearField("progress")
        assert bare == pb.TaskScheduleRun(
            **{f.name: v for f, v in counted.ListFields() if "counts" not in f.name}
        )
        expected: dict[str, tuple[int, int]] = {}
        for o in whole.outcomes:
            racks_, with_task = expected.get(o.outcome, (0, 0))
            expected[o.outcome] = (racks_ + 1, with_task + bool(o.task_id.id))
        assert {c.outcome: (c.racks, c.with_task) for c in counted.outcome_counts} == expected
        statuses: dict[int, int] = {}
        for o in whole.outcomes:
            if o.task_id.id:
                statuses[o.task_status] = statuses.get(o.task_status, 0) + 1
        assert {c.status: c.tasks for c in counted.task_counts} == statuses
    counted_runs = sorted([(c.outcome, c.racks, c.with_task) for c in r.outcome_counts] for r in basic.runs)
    assert counted_runs == [[("failed", 3, 0)], [("submitted", 3, 3)]]  # both at one time: either order

    for bad in (3, -1):
        await expect(grpc.StatusCode.INVALID_ARGUMENT, "view", listed(bad))  # type: ignore[arg-type]


@pytest.mark.parametrize(("budget", "pages"), [(1, 12), (2, 8), (4, 4), (7, 2), (12, 2)])
async def test_a_full_page_carries_at_most_its_outcomes_and_the_token_walks_each_one(
    stub: FlowStub, racks: list[Rack], monkeypatch: pytest.MonkeyPatch, budget: int, pages: int
) -> None:
    """ListTaskScheduleRuns' FULL view asked with a limit carries at most RUN_OUTCOMES_PER_PAGE outcomes a
    page: whole runs while they fit, and a run of more in parts, each alone on its page, with its
    `first_outcome` and `outcome_count`. Joined by id, the pages walked by token are the unpaged list, every
    outcome with its task's status. (A page of 20 runs of 10,000 racks carried 200,000 outcomes.)"""
    monkeypatch.setattr(schedule_service, "RUN_OUTCOMES_PER_PAGE", budget)
    schedule = await create(stub, "parts", "r1", "r2", "r3")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    for _ in range(3):  # each recorded, its racks failed: the first run's tasks are still pending
        trigger = stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
        await expect(grpc.StatusCode.FAILED_PRECONDITION, "submitted no task", trigger)
    unpaged = await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    assert len(unpaged.runs) == 4
    assert all(r.outcome_count == 3 and r.first_outcome == 0 for r in unpaged.runs)
    assert sum(o.task_status == pb.TASK_STATUS_PENDING for r in unpaged.runs for o in r.outcomes) == 3

    joined: list[pb.TaskScheduleRun] = []
    token, walked = "", 0
    while True:
        page = await stub.ListTaskScheduleRuns(
            pb.ListTaskScheduleRunsRequest(
                schedule_id=schedule.id, pagination=pb.Pagination(limit=3, page_token=token)
            )
        )
        walked += 1
        assert page.total == 4 and 1 <= len(page.runs) <= 3
        assert sum(len(r.outcomes) for r in page.runs) <= budget
        for run in page.runs:
            if joined and joined[-1].id == run.id:  # the next part of the run the last page ended in
                assert len(page.runs) == 1 and run.first_outcome == len(joined[-1].outcomes)
                joined[-1].outcomes.extend(run.outcomes)
            else:
                assert run.first_outcome == 0
                joined.append(run)
        token = page.next_page_token
        if not token:
            break
    assert joined == list(unpaged.runs)
    assert walked == pages


async def test_list_runs_of_unknown_schedule(stub: FlowStub) -> None:
    unknown = pb.ListTaskScheduleRunsRequest(schedule_id=pb.UUID(id="00000000-0000-0000-0000-000000000002"))
    await expect(grpc.StatusCode.NOT_FOUND, "schedule_id", stub.ListTaskScheduleRuns(unknown))


# --- rollouts ------------------------------------------------------------------------------------


def rollout_request(name: str, policy: pb.RolloutPolicy, *racks: str) -> pb.CreateTaskScheduleRequest:
    schedule = config(name)
    schedule.rollout.CopyFrom(policy)
    return pb.CreateTaskScheduleRequest(schedule=schedule, operation=power_off(*(racks or ("r1",))))


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (
            pb.RolloutPolicy(max_concurrent_racks=-1),
            "schedule.rollout.max_concurrent_racks: must not be negative",
        ),
        (pb.RolloutPolicy(max_per_domain=-1), "schedule.rollout.max_per_domain"),
        (pb.RolloutPolicy(canary_racks=-3), "schedule.rollout.canary_racks"),
        (pb.RolloutPolicy(halt_after_failures=-1), "schedule.rollout.halt_after_failures"),
        (pb.RolloutPolicy(halt_after_failure_percent=101), "schedule.rollout.halt_after_failure_percent"),
        (
            pb.RolloutPolicy(halt_after_failure_percent=float("nan")),
            "schedule.rollout.halt_after_failure_percent",
        ),
        (pb.RolloutPolicy(bake_time="0s"), "schedule.rollout.bake_time: must be positive"),
        (pb.RolloutPolicy(bake_time="-15m"), "schedule.rollout.bake_time"),
        (pb.RolloutPolicy(bake_time="1d"), "schedule.rollout.bake_time"),
        # The bake is the wait after the canaries: without any it was stored and did nothing.
        (pb.RolloutPolicy(bake_time="15m"), "schedule.rollout.bake_time: applies with canary_racks"),
    ],
)
async def test_a_bad_rollout_policy_is_invalid_argument_naming_the_field_and_writes_nothing(
    stub: FlowStub, services: Services, racks: list[Rack], policy: pb.RolloutPolicy, field: str
) -> None:
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT, field, stub.CreateTaskSchedule(rollout_request("fw", policy))
    )
    schedule = await create(stub, "plain", "r1")
    update = pb.UpdateTaskScheduleRequest(
        id=schedule.id,
        schedule=pb.ScheduleConfig(rollout=policy),
        update_mask=FieldMask(paths=["schedule.rollout"]),
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, stub.UpdateTaskSchedule(update))
    assert (await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))).HasField(
        "rollout"
    ) is False
    assert (await table_counts(services.db))["task_schedule"] == before["task_schedule"] + 1


async def test_a_rollout_policy_round_trips_and_the_run_shows_progress(
    stub: FlowStub, racks: list[Rack]
) -> None:
    policy = pb.RolloutPolicy(max_concurrent_racks=1, canary_racks=1, bake_time="15m", halt_after_failures=2)
    names = [r.name for r in racks]
    schedule = await stub.CreateTaskSchedule(rollout_request("fw", policy, *names))
    expected = pb.RolloutPolicy()
    expected.CopyFrom(policy)
    expected.pause_on_halt = True  # unset means true, and is shown as such
    assert schedule.rollout == expected
    (task_id,) = (await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))).task_ids
    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    assert run.state == "rolling" and run.rollout == expected
    assert (run.progress.total, run.progress.active, run.progress.pending) == (len(names), 1, len(names) - 1)
    assert run.progress.wave == "canary"
    first = run.outcomes[0]
    assert (first.outcome, first.task_id, first.task_status, first.canary) == (
        "submitted",
        task_id,
        pb.TASK_STATUS_PENDING,
        True,
    )
    assert await stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id)) == run
    task = (await stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id]))).tasks[0]
    assert task.run_id == run.id
    # A trigger while it rolls is refused and records nothing.
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "is still rolling",
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id)),
    )
    assert (
        await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    ).total == 1
    cancelled = await stub.CancelTaskScheduleRun(pb.CancelTaskScheduleRunRequest(id=run.id))
    assert cancelled.state == "cancelled" and cancelled.progress.not_started == len(names)
    # Its first rack's task, not claimed yet, is ended: that rack too is not started.
    assert (cancelled.outcomes[0].outcome, cancelled.outcomes[0].task_status) == (
        "not_started",
        pb.TASK_STATUS_TERMINATED,
    )
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "only a halted rollout can be resumed",
        stub.ResumeTaskScheduleRun(pb.ResumeTaskScheduleRunRequest(id=run.id)),
    )
    removed = await stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(id=schedule.id, update_mask=FieldMask(paths=["schedule.rollout"]))
    )
    assert not removed.HasField("rollout")


async def test_each_part_of_a_rollout_in_parts_carries_the_whole_runs_progress(
    stub: FlowStub, racks: list[Rack], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout's run in parts (more racks than a FULL page's outcomes): every part carries the progress
    of the whole run, as GetTaskScheduleRun gives it, and its own racks' outcomes with their tasks."""
    monkeypatch.setattr(schedule_service, "RUN_OUTCOMES_PER_PAGE", 2)
    policy = pb.RolloutPolicy(max_concurrent_racks=1, canary_racks=1)
    schedule = await stub.CreateTaskSchedule(rollout_request("fw", policy, *(r.name for r in racks)))
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    (whole,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    assert whole.progress.total == 3 and whole.progress.active == 1

    def page(token: str = "") -> Any:
        paged = pb.Pagination(limit=20, page_token=token)
        return stub.ListTaskScheduleRuns(
            pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id, pagination=paged)
        )

    first = await page()
    second = await page(first.next_page_token)
    parts = [*first.runs, *second.runs]
    assert [(p.first_outcome, len(p.outcomes), p.outcome_count) for p in parts] == [(0, 2, 3), (2, 1, 3)]
    assert all(p.progress == whole.progress for p in parts) and not second.next_page_token
    assert [o for p in parts for o in p.outcomes] == list(whole.outcomes)


@pytest.mark.parametrize("rpc", ["GetTaskScheduleRun", "ResumeTaskScheduleRun", "CancelTaskScheduleRun"])
async def test_run_rpcs_refuse_bad_and_unknown_ids_and_plain_runs(
    stub: FlowStub, services: Services, racks: list[Rack], rpc: str
) -> None:
    request_type = getattr(pb, f"{rpc}Request")
    call = getattr(stub, rpc)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", call(request_type(id=pb.UUID(id="not-a-uuid"))))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", call(request_type()))
    unknown = "00000000-0000-0000-0000-000000000003"
    await expect(
        grpc.StatusCode.NOT_FOUND,
        f"id: no task schedule run {unknown}",
        call(request_type(id=pb.UUID(id=unknown))),
    )
    schedule = await create(stub, "plain", "r1")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    if rpc == "GetTaskScheduleRun":
        assert (await call(request_type(id=run.id))).state == "completed"
        return
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.FAILED_PRECONDITION, "is not a rollout", call(request_type(id=run.id)))
    assert await table_counts(services.db) == before


# --- the preview of an unsaved schedule (a form's) ---------------------------------------------------


def draft(**fields: Any) -> pb.CreateTaskScheduleRequest:
    request = pb.CreateTaskScheduleRequest(schedule=config(), operation=power_off("r1"))
    for name, value in fields.items():
        getattr(request, name).CopyFrom(value)
    return request


async def test_a_draft_is_previewed_per_rack_and_nothing_is_written(
    stub: FlowStub, services: Services, db: Database
) -> None:
    await make_rack(services, "r1")
    before = await table_counts(db)
    preview = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(draft=draft(), count=2))
    assert [when(f.at) for f in preview.firings] == [START + timedelta(hours=n) for n in (1, 2)]
    assert [(s.rack_name, s.decision) for s in preview.firings[0].scopes] == [("r1", "fire")]
    nameless = draft(schedule=config(name=""))  # a form may not have a name yet
    assert len((await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(draft=nameless))).firings) == 10
    assert await table_counts(db) == before


@pytest.mark.parametrize(
    ("request_fields", "code", "field"),
    [
        (
            {"draft": draft(schedule=config(spec="fast"))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft.schedule.spec.spec",
        ),
        (
            {"draft": draft(schedule=config(spec_type=pb.SCHEDULE_SPEC_TYPE_UNSPECIFIED))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft.schedule.spec.type",
        ),
        (
            {
                "draft": draft(
                    schedule=config(spec_type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 2 * * *", timezone="X/Y")
                )
            },
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft.schedule.spec.timezone",
        ),
        (
            {"draft": draft(schedule=config(name="\tx"))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft.schedule.name",
        ),
        (
            {"draft": draft(operation=pb.ScheduledOperation())},
            grpc.StatusCode.INVALID_ARGUMENT,
            "draft.operation",
        ),
        (
            {"draft": draft(operation=power_off("r9"))},
            grpc.StatusCode.NOT_FOUND,
            "draft.target_spec.racks[0]",
        ),
        ({"draft": draft(), "count": 101}, grpc.StatusCode.INVALID_ARGUMENT, "count"),
        (
            {"draft": draft(), "id": pb.UUID(id="00000000-0000-0000-0000-000000000002")},
            grpc.StatusCode.NOT_FOUND,
            "id",
        ),
        ({"draft": draft(), "id": pb.UUID(id="nope")}, grpc.StatusCode.INVALID_ARGUMENT, "id"),
    ],
)
async def test_a_bad_draft_names_the_field(
    stub: FlowStub, services: Services, request_fields: dict[str, Any], code: grpc.StatusCode, field: str
) -> None:
    await make_rack(services, "r1")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(**request_fields))
    assert info.value.code() == code, info.value.details()
    assert (info.value.details() or "").startswith(f"{field}: "), info.value.details()


# --- retries (docs/SAFETY.md) ---------------------------------------------------------------------


def retry_request(name: str, policy: pb.RetryPolicy, *racks: str) -> pb.CreateTaskScheduleRequest:
    schedule = config(name)
    schedule.retry.CopyFrom(policy)
    return pb.CreateTaskScheduleRequest(schedule=schedule, operation=power_off(*(racks or ("r1",))))


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (
            pb.RetryPolicy(),
            "schedule.retry.max_attempts: required (attempts in all, the first included: 2..10)",
        ),
        (pb.RetryPolicy(max_attempts=11), "schedule.retry.max_attempts: must be 2..10, got 11"),
        (pb.RetryPolicy(max_attempts=3, initial_backoff="soon"), "schedule.retry.initial_backoff"),
        (pb.RetryPolicy(max_attempts=3, max_backoff="0s"), "schedule.retry.max_backoff"),
        (pb.RetryPolicy(max_attempts=3, multiplier=0.5), "schedule.retry.multiplier: must be 1..10"),
        (
            pb.RetryPolicy(max_attempts=3, initial_backoff="1h", max_backoff="1m"),
            "schedule.retry.initial_backoff",
        ),
    ],
)
async def test_a_bad_retry_policy_is_invalid_argument_naming_the_field_and_writes_nothing(
    stub: FlowStub, services: Services, racks: list[Rack], policy: pb.RetryPolicy, field: str
) -> None:
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT, field, stub.CreateTaskSchedule(retry_request("fw", policy))
    )
    schedule = await create(stub, "plain", "r1")
    update = pb.UpdateTaskScheduleRequest(
        id=schedule.id,
        schedule=pb.ScheduleConfig(retry=policy),
        update_mask=FieldMask(paths=["schedule.retry"]),
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, stub.UpdateTaskSchedule(update))
    assert not (await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))).HasField("retry")
    assert (await table_counts(services.db))["task_schedule"] == before["task_schedule"] + 1


async def test_a_retry_policy_round_trips_with_its_defaults_and_tasks_show_their_attempt(
    stub: FlowStub, racks: list[Rack]
) -> None:
    schedule = await stub.CreateTaskSchedule(retry_request("fw", pb.RetryPolicy(max_attempts=4)))
    assert schedule.retry == pb.RetryPolicy(
        max_attempts=4, initial_backoff="30s", multiplier=2.0, max_backoff="10m"
    )
    (task_id,) = (await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))).task_ids
    (task,) = (await stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id]))).tasks
    assert (task.attempt, task.max_attempts, list(task.attempts)) == (1, 4, [])
    removed = await stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(id=schedule.id, update_mask=FieldMask(paths=["schedule.retry"]))
    )
    assert not removed.HasField("retry")


async def test_retry_run_refuses_bad_and_unknown_ids_and_runs_that_are_not_over(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    call = stub.RetryTaskScheduleRun
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", call(pb.RetryTaskScheduleRunRequest()))
    bad = pb.RetryTaskScheduleRunRequest(id=pb.UUID(id="not-a-uuid"))
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", call(bad))
    unknown = "00000000-0000-0000-0000-000000000003"
    await expect(
        grpc.StatusCode.NOT_FOUND,
        f"id: no task schedule run {unknown}",
        call(pb.RetryTaskScheduleRunRequest(id=pb.UUID(id=unknown))),
    )
    schedule = await stub.CreateTaskSchedule(
        rollout_request("fw", pb.RolloutPolicy(max_concurrent_racks=1), "r1", "r2")
    )
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"id: run {run.id.id} is rolling; only a finished or halted run can be retried",
        call(pb.RetryTaskScheduleRunRequest(id=run.id)),
    )
    assert await table_counts(services.db) == before


async def test_retry_run_re_runs_the_failed_racks_as_a_linked_run(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    schedule = await create(stub, "plain", "r1", "r2")
    task_ids = (await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))).task_ids
    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    async with services.db.transaction() as conn:
        ids = [uuid.UUID(t.id) for t in task_ids]
        await task_store.set_status(conn, ids[:1], TaskStatus.FAILED, now=datetime.now(UTC))
        await task_store.set_status(conn, ids[1:], TaskStatus.COMPLETED, now=datetime.now(UTC))
    again = await stub.RetryTaskScheduleRun(pb.RetryTaskScheduleRunRequest(id=run.id))
    assert again.retry_of == run.id and again.trigger == "manual"
    assert [o.rack_id for o in again.outcomes] == [
        o.rack_id for o in run.outcomes if o.task_id == task_ids[0]
    ]
    old = await stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id))
    assert list(old.retried_by) == [again.id]


@pytest.mark.parametrize(
    ("request_id", "says"),
    [("x" * 65, "at most 64 characters, got 65"), ("a b", "may hold only"), ("ré", "may hold only")],
)
async def test_a_bad_request_id_is_invalid_argument_and_fires_nothing(
    stub: FlowStub, services: Services, racks: list[Rack], request_id: str, says: str
) -> None:
    schedule = await create(stub, "s", "r1")
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id=request_id)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.TriggerTaskSchedule(trigger)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("request_id: ") and says in (info.value.details() or "")
    retry = pb.RetryTaskScheduleRunRequest(id=pb.UUID(id=str(uuid.uuid4())), request_id=request_id)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.RetryTaskScheduleRun(retry)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("request_id: ")
    runs = await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    assert list(runs.runs) == []
    # 64 of every allowed character is taken.
    fine = ("Az09._:-" * 8)[:64]
    fired = await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id, request_id=fine))
    assert len(fired.task_ids) == 1
