"""The six maintenance window RPCs through an in-process gRPC server: shapes, bad input naming the field
(and writing nothing), the rack filter, updates by mask, and the preview."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.clock import Clock, FakeClock
from rackflow.domain.inventory import Rack
from rackflow.errors import Unavailable
from rackflow.services import Services
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from rackflow.windows import service as window_service
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.conftest import table_counts

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday


@pytest.fixture
def clock() -> Clock:
    return FakeClock(START)


@pytest.fixture
async def racks(services: Services) -> list[Rack]:
    r1 = await services.inventory.create_rack("r1")
    r2 = await services.inventory.create_rack("r2")
    r3 = await services.inventory.create_rack("r3")
    await services.inventory.create_domain("nvl-a", [r2.id])
    return [r1, r2, r3]


def ts(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def saturday_nights(name: str = "sat-night", **fields: Any) -> pb.MaintenanceWindow:
    return pb.MaintenanceWindow(
        **{
            "name": name,
            "kind": pb.WINDOW_KIND_ALLOW,
            "recurring": pb.RecurringWindow(cron="0 22 * * 6", duration="6h", timezone="Europe/Berlin"),
            **fields,
        }
    )


def freeze(name: str = "launch", hours: int = 24, **fields: Any) -> pb.MaintenanceWindow:
    return pb.MaintenanceWindow(
        name=name,
        kind=pb.WINDOW_KIND_FREEZE,
        one_off=pb.OneOffWindow(start=ts(START), end=ts(START + timedelta(hours=hours))),
        **fields,
    )


async def create(stub: FlowStub, window: pb.MaintenanceWindow) -> pb.MaintenanceWindow:
    created: pb.MaintenanceWindow = await stub.CreateMaintenanceWindow(
        pb.CreateMaintenanceWindowRequest(window=window)
    )
    return created


async def expect(code: grpc.StatusCode, field: str, call: Awaitable[Any]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert (info.value.details() or "").startswith(field), info.value.details()


async def test_create_get_list_and_delete(stub: FlowStub, racks: list[Rack]) -> None:
    allow = await create(
        stub,
        saturday_nights(
            reason="agreed with the tenants",
            racks=[pb.WindowTarget(name="r1")],
            nvl_domains=[pb.WindowTarget(name="nvl-a")],
            operations=["upgrade_firmware"],
        ),
    )
    assert [(t.id.id, t.name) for t in allow.racks] == [(str(racks[0].id), "r1")]
    assert [t.name for t in allow.nvl_domains] == ["nvl-a"]
    assert (allow.kind, allow.recurring.duration, list(allow.operations)) == (
        pb.WINDOW_KIND_ALLOW,
        "6h",
        ["upgrade_firmware"],
    )
    everywhere = await create(stub, freeze())
    assert not everywhere.racks and not everywhere.nvl_domains

    got = await stub.GetMaintenanceWindow(pb.GetMaintenanceWindowRequest(id=allow.id))
    assert got == allow
    listed = await stub.ListMaintenanceWindows(pb.ListMaintenanceWindowsRequest())
    assert [w.name for w in listed.windows] == ["launch", "sat-night"]
    for rack, names in (
        (racks[0], ["launch", "sat-night"]),
        (racks[1], ["launch", "sat-night"]),
        (racks[2], ["launch"]),
    ):
        request = pb.ListMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(rack.id)))
        assert [w.name for w in (await stub.ListMaintenanceWindows(request)).windows] == names

    await stub.DeleteMaintenanceWindow(pb.DeleteMaintenanceWindowRequest(id=allow.id))
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "id",
        stub.GetMaintenanceWindow(pb.GetMaintenanceWindowRequest(id=allow.id)),
    )
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "id",
        stub.DeleteMaintenanceWindow(pb.DeleteMaintenanceWindowRequest(id=allow.id)),
    )


BAD_WINDOWS: list[tuple[pb.MaintenanceWindow, grpc.StatusCode, str]] = [
    (saturday_nights(name=""), grpc.StatusCode.INVALID_ARGUMENT, "window.name"),
    (
        pb.MaintenanceWindow(name="w", kind=pb.WINDOW_KIND_ALLOW),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.when",
    ),
    (saturday_nights(kind=pb.WINDOW_KIND_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT, "window.kind"),
    (saturday_nights(kind=9), grpc.StatusCode.INVALID_ARGUMENT, "window.kind"),
    (
        pb.MaintenanceWindow(
            name="w", kind=1, recurring=pb.RecurringWindow(cron="0 22 * * 6", duration="0s")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.recurring.duration",
    ),
    (
        pb.MaintenanceWindow(
            name="w", kind=1, recurring=pb.RecurringWindow(cron="0 * * * *", duration="90m")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.recurring.duration",
    ),
    (
        pb.MaintenanceWindow(
            name="w", kind=1, recurring=pb.RecurringWindow(cron="0 25 * * *", duration="1h")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.recurring.cron",
    ),
    (
        pb.MaintenanceWindow(
            name="w",
            kind=1,
            recurring=pb.RecurringWindow(cron="0 2 * * *", duration="1h", timezone="Mars/Base"),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.recurring.timezone",
    ),
    (freeze(hours=0), grpc.StatusCode.INVALID_ARGUMENT, "window.one_off.end"),
    (freeze(hours=-1), grpc.StatusCode.INVALID_ARGUMENT, "window.one_off.end"),
    (
        pb.MaintenanceWindow(name="w", kind=2, one_off=pb.OneOffWindow(start=ts(START))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.one_off.end",
    ),
    (freeze(racks=[pb.WindowTarget(name="nope")]), grpc.StatusCode.NOT_FOUND, "window.racks[0]"),
    (
        freeze(racks=[pb.WindowTarget(id=pb.UUID(id="6f1c1f9e-0000-4000-8000-000000000000"))]),
        grpc.StatusCode.NOT_FOUND,
        "window.racks[0]",
    ),
    (
        freeze(racks=[pb.WindowTarget(id=pb.UUID(id="x"))]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.racks[0].id",
    ),
    (freeze(racks=[pb.WindowTarget()]), grpc.StatusCode.INVALID_ARGUMENT, "window.racks[0]"),
    (
        freeze(racks=[pb.WindowTarget(name="r1"), pb.WindowTarget(name="r1")]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.racks[1]",
    ),
    (freeze(nvl_domains=[pb.WindowTarget(name="nope")]), grpc.StatusCode.NOT_FOUND, "window.nvl_domains[0]"),
    (freeze(operations=["reboot"]), grpc.StatusCode.INVALID_ARGUMENT, "window.operations[0]"),
    (
        freeze(operations=["power_on", "power_on"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.operations[1]",
    ),
    (freeze(reason="a\x00b"), grpc.StatusCode.INVALID_ARGUMENT, "window.reason"),
    # A one-off window already over would never apply (a freeze given the wrong year protects nothing).
    (
        pb.MaintenanceWindow(
            name="last-year",
            kind=pb.WINDOW_KIND_FREEZE,
            one_off=pb.OneOffWindow(
                start=ts(START - timedelta(days=366)), end=ts(START - timedelta(days=365))
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.one_off.end: 2025-",
    ),
    # Asked about at every claim of a task on a rack: at most as many as one request may target.
    (
        freeze(racks=[pb.WindowTarget(name=f"r{i}") for i in range(10_001)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.racks: at most 10000 racks, got 10001",
    ),
    (
        freeze(nvl_domains=[pb.WindowTarget(name=f"d{i}") for i in range(10_001)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "window.nvl_domains: at most 10000 NVLink domains, got 10001",
    ),
]


@pytest.mark.parametrize(("window", "code", "field"), BAD_WINDOWS, ids=lambda v: str(v)[:40])
async def test_bad_create_names_the_field_and_writes_nothing(
    stub: FlowStub,
    services: Services,
    racks: list[Rack],
    window: pb.MaintenanceWindow,
    code: grpc.StatusCode,
    field: str,
) -> None:
    before = await table_counts(services.db)
    await expect(code, field, create(stub, window))
    assert await table_counts(services.db) == before


async def test_duplicate_name_is_already_exists(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    await create(stub, freeze())
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.ALREADY_EXISTS, "window.name", create(stub, freeze()))
    assert await table_counts(services.db) == before


async def test_update_by_mask(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    window = await create(stub, freeze(racks=[pb.WindowTarget(name="r1")]))

    async def update(paths: list[str], **fields: Any) -> pb.MaintenanceWindow:
        request = pb.UpdateMaintenanceWindowRequest(
            id=window.id, window=pb.MaintenanceWindow(**fields), update_mask=FieldMask(paths=paths)
        )
        updated: pb.MaintenanceWindow = await stub.UpdateMaintenanceWindow(request)
        return updated

    renamed = await update(["window.name", "window.reason"], name="launch-week", reason="launch")
    assert (renamed.name, renamed.reason, [t.name for t in renamed.racks]) == (
        "launch-week",
        "launch",
        ["r1"],
    )
    moved = await update(["window.racks", "window.nvl_domains"], nvl_domains=[pb.WindowTarget(name="nvl-a")])
    assert (list(moved.racks), [t.name for t in moved.nvl_domains]) == ([], ["nvl-a"])
    everywhere = await update(["window.nvl_domains"])
    listed = await stub.ListMaintenanceWindows(
        pb.ListMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(racks[2].id)))
    )
    assert not everywhere.nvl_domains and [w.name for w in listed.windows] == ["launch-week"]
    recurring = await update(
        ["window.when", "window.kind"],
        kind=pb.WINDOW_KIND_ALLOW,
        recurring=pb.RecurringWindow(cron="0 2 * * *", duration="2h"),
    )
    assert (recurring.kind, recurring.recurring.cron, recurring.HasField("one_off")) == (
        pb.WINDOW_KIND_ALLOW,
        "0 2 * * *",
        False,
    )

    before = await table_counts(services.db)
    for paths, fields, code, field in (
        ([], {}, grpc.StatusCode.INVALID_ARGUMENT, "update_mask"),
        (["window.colour"], {}, grpc.StatusCode.INVALID_ARGUMENT, "update_mask"),
        (["window.name"], {"name": ""}, grpc.StatusCode.INVALID_ARGUMENT, "window.name"),
        (["window.kind"], {}, grpc.StatusCode.INVALID_ARGUMENT, "window.kind"),
        (["window.when"], {}, grpc.StatusCode.INVALID_ARGUMENT, "window.when"),
        (
            ["window.when"],
            {"recurring": pb.RecurringWindow(cron="0 2 * * *", duration="25h")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "window.recurring.duration",
        ),
        (
            ["window.racks"],
            {"racks": [pb.WindowTarget(name="nope")]},
            grpc.StatusCode.NOT_FOUND,
            "window.racks[0]",
        ),
    ):
        await expect(code, field, update(paths, **fields))
    await create(stub, freeze("other"))
    await expect(grpc.StatusCode.ALREADY_EXISTS, "window.name", update(["window.name"], name="other"))
    after = await table_counts(services.db)
    assert after == {**before, "maintenance_windows": before["maintenance_windows"] + 1}
    got = await stub.GetMaintenanceWindow(pb.GetMaintenanceWindowRequest(id=window.id))
    assert got == recurring


async def test_deleting_a_rack_takes_it_out_of_its_windows(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    window = await create(stub, freeze(racks=[pb.WindowTarget(name="r1")]))
    await services.inventory.delete_rack(racks[0].id)
    got = await stub.GetMaintenanceWindow(pb.GetMaintenanceWindowRequest(id=window.id))
    assert list(got.racks) == [] and list(got.nvl_domains) == []
    # Both lists empty read as "every rack": the window says it covers none (the CLI and console did not).
    assert got.covers_no_rack
    (listed,) = [
        w
        for w in (await stub.ListMaintenanceWindows(pb.ListMaintenanceWindowsRequest())).windows
        if w.name == "launch"
    ]
    assert listed.covers_no_rack
    for rack in racks[1:]:  # covering no rack, it does not become a window over every rack
        request = pb.ListMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(rack.id)))
        assert list((await stub.ListMaintenanceWindows(request)).windows) == []
    assert not (await create(stub, freeze("everywhere"))).covers_no_rack  # a window over every rack


async def test_preview_lists_openings_and_closings_for_a_rack(stub: FlowStub, racks: list[Rack]) -> None:
    await create(stub, saturday_nights(nvl_domains=[pb.WindowTarget(name="nvl-a")]))
    await create(stub, freeze(hours=2))
    request = pb.PreviewMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(racks[1].id)), count=4)
    events = (await stub.PreviewMaintenanceWindows(request)).events
    assert [(e.at.ToDatetime(tzinfo=UTC), e.window_name, e.change) for e in events] == [
        (START + timedelta(hours=2), "launch", "closes"),  # open at `after` (now): only its closing
        (datetime(2026, 3, 7, 21, 0, tzinfo=UTC), "sat-night", "opens"),  # 22:00 CET
        (datetime(2026, 3, 8, 3, 0, tzinfo=UTC), "sat-night", "closes"),
        (datetime(2026, 3, 14, 21, 0, tzinfo=UTC), "sat-night", "opens"),
    ]
    elsewhere = pb.PreviewMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(racks[0].id)))
    assert [e.window_name for e in (await stub.PreviewMaintenanceWindows(elsewhere)).events] == ["launch"]
    for bad, code, field in (
        (pb.PreviewMaintenanceWindowsRequest(), grpc.StatusCode.INVALID_ARGUMENT, "rack_id"),
        (
            pb.PreviewMaintenanceWindowsRequest(rack_id=pb.UUID(id="6f1c1f9e-0000-4000-8000-000000000000")),
            grpc.StatusCode.NOT_FOUND,
            "rack_id",
        ),
        (
            pb.PreviewMaintenanceWindowsRequest(rack_id=pb.UUID(id=str(racks[0].id)), count=101),
            grpc.StatusCode.INVALID_ARGUMENT,
            "count",
        ),
    ):
        await expect(code, field, stub.PreviewMaintenanceWindows(bad))


async def test_the_override_needs_the_operator_role_and_is_audited(
    services: Services, racks: list[Rack]
) -> None:
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")]))
    request = pb.PowerOnRackRequest(
        target_spec=target, queue_options=pb.QueueOptions(ignore_windows=True), description="urgent fix"
    )
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        secured = FlowStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await secured.PowerOnRack(request, metadata=bearer(VIEWER_TOKEN))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        submitted = await secured.PowerOnRack(request, metadata=bearer(OPERATOR_TOKEN))
        (task,) = (
            await secured.GetTasksByIDs(
                pb.GetTasksByIDsRequest(task_ids=submitted.task_ids), metadata=bearer(VIEWER_TOKEN)
            )
        ).tasks
        assert task.ignore_windows
        listed = await secured.ListAuditEvents(
            pb.ListAuditEventsRequest(method="PowerOnRack"), metadata=bearer(VIEWER_TOKEN)
        )
    event, denied = listed.events  # the viewer's attempt is in the trail too, refused by its role
    assert (event.principal, event.outcome) == ("oncall", "OK")
    assert (denied.principal, denied.outcome) == ("dashboard", "PERMISSION_DENIED")
    for recorded in (event, denied):
        assert json.loads(recorded.request_json)["queue_options"]["ignore_windows"] is True


async def test_schedule_window_policy_round_trips_and_schedules_cannot_ignore_windows(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")]))
    spec = pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")

    def creating(policy: int, ignore: bool = False) -> Any:
        return stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(
                schedule=pb.ScheduleConfig(name="nightly", spec=spec, window_policy=policy),  # type: ignore[arg-type]
                operation=pb.ScheduledOperation(
                    power_on=pb.PowerOnRackRequest(
                        target_spec=target, queue_options=pb.QueueOptions(ignore_windows=ignore)
                    )
                ),
            )
        )

    before = await table_counts(services.db)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "schedule.window_policy", creating(7))
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "operation.power_on.queue_options.ignore_windows",
        creating(pb.WINDOW_POLICY_SKIP, ignore=True),
    )
    assert await table_counts(services.db) == before
    schedule = await creating(pb.WINDOW_POLICY_DEFER)
    assert schedule.window_policy == pb.WINDOW_POLICY_DEFER
    update = pb.UpdateTaskScheduleRequest(
        id=schedule.id,
        schedule=pb.ScheduleConfig(window_policy=pb.WINDOW_POLICY_SKIP),
        update_mask=FieldMask(paths=["schedule.window_policy"]),
    )
    assert (await stub.UpdateTaskSchedule(update)).window_policy == pb.WINDOW_POLICY_SKIP
    update.schedule.window_policy = 5  # type: ignore[assignment]
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "schedule.window_policy", stub.UpdateTaskSchedule(update))


async def test_preview_task_schedule(stub: FlowStub, racks: list[Rack]) -> None:
    await create(stub, freeze(hours=3, racks=[pb.WindowTarget(name="r1")]))
    target = pb.OperationTargetSpec(
        racks=pb.RackTargets(targets=[pb.RackTarget(name="r1"), pb.RackTarget(name="r2")])
    )
    schedule = await stub.CreateTaskSchedule(
        pb.CreateTaskScheduleRequest(
            schedule=pb.ScheduleConfig(
                name="hourly",
                spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h"),
                window_policy=pb.WINDOW_POLICY_DEFER,
            ),
            operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=target)),
        )
    )
    preview = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=4))
    rows = [
        (f.at.ToDatetime(tzinfo=UTC), sorted((d.rack_name, d.decision, d.window_name) for d in f.scopes))
        for f in preview.firings
    ]
    assert rows == [
        (START + timedelta(hours=1), [("r1", "defer", "launch"), ("r2", "fire", "")]),
        (START + timedelta(hours=2), [("r1", "defer", "launch"), ("r2", "fire", "")]),
        (START + timedelta(hours=3), [("r1", "fire", ""), ("r2", "fire", "")]),
        (START + timedelta(hours=4), [("r1", "fire", ""), ("r2", "fire", "")]),
    ]
    (deferred,) = [d for d in preview.firings[0].scopes if d.rack_name == "r1"]
    assert deferred.until.ToDatetime(tzinfo=UTC) == START + timedelta(hours=3)
    assert not deferred.HasField("closes_at") and "inside freeze 'launch'" in deferred.reason
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    paused = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=1))
    assert [d.decision for d in paused.firings[0].scopes] == ["paused", "paused"]
    missing = pb.UUID(id="6f1c1f9e-0000-4000-8000-000000000000")
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=missing))
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "count",
        stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=-1)),
    )


async def test_a_change_whose_after_commit_steps_fail_answers_ok_and_is_audited_so(
    services: Services, racks: list[Rack], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the change committed, what it does after (its tasks decided again, freeze holds let go) may
    fail, the database gone: the call answers OK all the same, and its audit event records it so (the
    executors' look again finishes that work: tests/store/test_window_backstop.py)."""

    async def lost(*_: object) -> None:
        raise Unavailable("the database connection was lost")

    async with secured_server(services, None) as address, grpc.aio.insecure_channel(address) as channel:
        audited = FlowStub(channel)
        window = await create(audited, freeze(racks=[pb.WindowTarget(name="r1")]))
        monkeypatch.setattr(services.deferrals, "_again", lost)
        monkeypatch.setattr(window_service, "let_go_of_freezes", lost)
        mask = FieldMask(paths=["window.reason"])
        updated = await audited.UpdateMaintenanceWindow(
            pb.UpdateMaintenanceWindowRequest(
                id=window.id, window=pb.MaintenanceWindow(reason="late"), update_mask=mask
            )
        )
        await audited.DeleteMaintenanceWindow(pb.DeleteMaintenanceWindowRequest(id=window.id))
        assert updated.reason == "late"
        for method in ("UpdateMaintenanceWindow", "DeleteMaintenanceWindow"):
            (event,) = (await audited.ListAuditEvents(pb.ListAuditEventsRequest(method=method))).events
            assert (event.outcome, event.error, event.target_ids[0]) == ("OK", "", window.id)


@pytest.mark.parametrize("method", ["RedecideWindowTask", "ReleaseFreezeHold"])
async def test_the_audit_trail_may_be_read_for_rackflow_s_own_window_decisions(
    stub: FlowStub, method: str
) -> None:
    """A task's window decision an executor's look again made, or a freeze hold it let go of, is recorded
    under a method that is no RPC's (`rackflow.audit.decisions`); the trail may still be filtered by it."""
    found = await stub.ListAuditEvents(pb.ListAuditEventsRequest(method=method))
    assert found.total == 0
