"""The audit trail through a real gRPC server: what is recorded, schedule before/after, ListAuditEvents."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import metrics
from rackflow.api import audit as audit_interceptor
from rackflow.clock import Clock, FakeClock
from rackflow.domain.audit import AuditEvent
from rackflow.domain.inventory import ComponentSpec, ComponentType
from rackflow.domain.windows import WindowKind, WindowPolicy
from rackflow.security import Principal, Role, current_principal
from rackflow.services import Services
from rackflow.store import audit as audit_store
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from rackflow.windows.service import Ref, WindowInput
from tests.api.secured import FLOW, OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.api.test_request_decoding import TRUNCATED, raw_call
from tests.store.schedules_support import Env
from tests.store.test_windows_firing import NIGHTLY, dispatch_at, with_policy

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
OPERATOR = bearer(OPERATOR_TOKEN)
VIEWER = bearer(VIEWER_TOKEN)
SECOND = timedelta(seconds=1)
HOURLY = pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")


@pytest.fixture
def clock() -> Clock:
    return FakeClock(START)


@pytest.fixture
async def stub(services: Services) -> AsyncIterator[FlowStub]:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        yield FlowStub(channel)


async def events(stub: FlowStub, **filters: object) -> list[pb.AuditEvent]:
    response = await stub.ListAuditEvents(pb.ListAuditEventsRequest(**filters), metadata=VIEWER)  # type: ignore[arg-type]
    return list(response.events)


def racks_spec(*names: str) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=n) for n in names]))


async def create_schedule(stub: FlowStub, name: str = "nightly") -> pb.TaskSchedule:
    request = pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(name=name, spec=HOURLY),
        operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=racks_spec("r1"))),
    )
    schedule: pb.TaskSchedule = await stub.CreateTaskSchedule(request, metadata=OPERATOR)
    return schedule


async def test_a_mutation_records_who_what_when_and_outcome(stub: FlowStub) -> None:
    components = [pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="c1")]
    rack = await stub.CreateRack(pb.CreateRackRequest(name="r1", components=components), metadata=OPERATOR)
    (event,) = await events(stub)
    assert (event.principal, event.method, event.outcome, event.error) == ("oncall", "CreateRack", "OK", "")
    assert event.at.ToDatetime(tzinfo=UTC) == START
    assert [i.id for i in event.target_ids] == [rack.id.id, rack.components[0].id.id]
    assert json.loads(event.request_json)["name"] == "r1"
    assert event.schedule_before_json == event.schedule_after_json == ""


async def test_a_change_whose_request_json_cannot_render_is_in_the_trail(stub: FlowStub) -> None:
    """An output-only timestamp out of its range (the handler ignores it) let the change through, and then
    the trail's JSON rendering raised: the client got UNKNOWN and no row was written. The row now keeps
    the request as protobuf text, and the call answers as it would have."""
    budget = pb.OperationBudget(name="sneaky", operations=["power_on"], max_running=5)
    budget.created_at.seconds = 10**12  # past year 9999
    created = await stub.CreateOperationBudget(
        pb.CreateOperationBudgetRequest(budget=budget), metadata=OPERATOR
    )
    (event,) = await events(stub)
    assert (event.method, event.outcome) == ("CreateOperationBudget", "OK")
    assert created.id.id in [i.id for i in event.target_ids]
    assert 'name: "sneaky"' in json.loads(event.request_json)["unrendered"]


async def test_reads_are_not_recorded(stub: FlowStub) -> None:
    await stub.ListRacks(pb.ListRacksRequest(), metadata=OPERATOR)
    await stub.ListTasks(pb.ListTasksRequest(), metadata=OPERATOR)
    assert await events(stub) == []


async def test_a_failed_mutation_records_its_code_and_message(stub: FlowStub, clock: FakeClock) -> None:
    missing = "6f1c1f9e-0000-4000-8000-000000000000"
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.DeleteRack(pb.DeleteRackRequest(id=pb.UUID(id=missing)), metadata=OPERATOR)
    clock.advance(SECOND)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.CreateRack(pb.CreateRackRequest(name=""), metadata=OPERATOR)
    invalid, not_found = await events(stub)
    assert (not_found.method, not_found.outcome, [i.id for i in not_found.target_ids]) == (
        "DeleteRack",
        "NOT_FOUND",
        [missing],
    )
    assert missing in not_found.error
    assert (invalid.method, invalid.outcome) == ("CreateRack", "INVALID_ARGUMENT")


async def test_a_refused_request_holding_a_nul_is_in_the_trail(stub: FlowStub, clock: FakeClock) -> None:
    """PostgreSQL stores no NUL in text or JSONB, and a request holding one is refused for it: its row
    failed to insert there, so such probes left no trace. The NUL is recorded as U+2400 (␀)."""
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.CreateRack(pb.CreateRackRequest(name="r\x001"), metadata=OPERATOR)
    clock.advance(SECOND)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.DeleteRack(pb.DeleteRackRequest(id=pb.UUID(id="x\x00")), metadata=OPERATOR)
    delete, create = await events(stub)
    assert (create.method, create.outcome) == ("CreateRack", "INVALID_ARGUMENT")
    assert json.loads(create.request_json)["name"] == "r\u24001"
    assert (delete.method, delete.outcome) == ("DeleteRack", "INVALID_ARGUMENT")
    assert [i.id for i in delete.target_ids] == ["x\u2400"]
    assert json.loads(delete.request_json) == {"id": {"id": "x\u2400"}}


async def test_a_call_its_role_may_not_make_is_recorded_as_denied(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    """A viewer deleting a schedule, an operator approving a run: refused by role, nothing runs, and the
    trail says who tried what (the refusal was only logged, so an operator reading the trail never saw
    it). Recorded as a refusal by validation is: the principal, the RPC, its ids, `PERMISSION_DENIED`
    with the message the caller got, the schedule as it stood (unchanged)."""
    await services.inventory.create_rack("r1")
    schedule = await create_schedule(stub)
    clock.advance(SECOND)
    with pytest.raises(grpc.aio.AioRpcError) as delete_refused:
        await stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=schedule.id), metadata=VIEWER)
    assert delete_refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    clock.advance(SECOND)
    run_id = pb.UUID(id=str(uuid.uuid4()))
    with pytest.raises(grpc.aio.AioRpcError) as approve_refused:
        approve = pb.ApproveTaskScheduleRunRequest(id=run_id, comment="lgtm")
        await stub.ApproveTaskScheduleRun(approve, metadata=OPERATOR)
    assert approve_refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

    approve_event, delete_event, _create = await events(stub)
    assert (delete_event.principal, delete_event.method, delete_event.outcome) == (
        "dashboard",
        "DeleteTaskSchedule",
        "PERMISSION_DENIED",
    )
    assert delete_event.error == delete_refused.value.details()
    assert [i.id for i in delete_event.target_ids] == [schedule.id.id]
    before = json.loads(delete_event.schedule_before_json)
    assert before == json.loads(delete_event.schedule_after_json) and before["name"] == "nightly"
    assert (approve_event.principal, approve_event.method, approve_event.outcome) == (
        "oncall",
        "ApproveTaskScheduleRun",
        "PERMISSION_DENIED",
    )
    assert approve_event.error == approve_refused.value.details()
    assert [i.id for i in approve_event.target_ids] == [run_id.id]
    assert json.loads(approve_event.request_json) == {"id": {"id": run_id.id}, "comment": "lgtm"}
    history = await events(stub, target=schedule.id)
    assert [(e.method, e.outcome) for e in history] == [
        ("DeleteTaskSchedule", "PERMISSION_DENIED"),
        ("CreateTaskSchedule", "OK"),
    ]
    assert (await services.schedules.get(uuid.UUID(schedule.id.id))).name == "nightly"


async def test_a_denied_call_whose_bytes_do_not_parse_is_recorded_with_the_parsers_reason(
    stub: FlowStub, services: Services
) -> None:
    """The role is checked before the request's bytes are parsed: the caller gets PERMISSION_DENIED, and
    the trail holds who tried which RPC, with the parser's reason for its request."""
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        refused = await raw_call(channel, f"/{FLOW}/DeleteRack", TRUNCATED, VIEWER_TOKEN)
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    (event,) = await events(stub)
    assert (event.principal, event.method, event.outcome, event.error) == (
        "dashboard",
        "DeleteRack",
        "PERMISSION_DENIED",
        refused.details(),
    )
    assert list(event.target_ids) == []
    assert json.loads(event.request_json)["unparsed"].startswith(
        "the bytes sent do not parse: Error parsing message"
    )


async def test_a_permitted_call_whose_bytes_do_not_parse_is_recorded_and_a_read_is_not(
    stub: FlowStub, services: Services
) -> None:
    """An operator's DeleteRack whose bytes do not parse was answered INVALID_ARGUMENT with no row: the
    trail showed nothing of a script sending what the server could not read, though a call refused by its
    role, or by its service, has its row. A read's is refused alike and, as every read, not recorded."""
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        refused = await raw_call(channel, f"/{FLOW}/DeleteRack", TRUNCATED, OPERATOR_TOKEN)
        read = await raw_call(channel, f"/{FLOW}/GetRack", TRUNCATED, OPERATOR_TOKEN)
    assert refused.code() == read.code() == grpc.StatusCode.INVALID_ARGUMENT
    (event,) = await events(stub)
    assert (event.principal, event.method, event.outcome, event.error) == (
        "oncall",
        "DeleteRack",
        "INVALID_ARGUMENT",
        refused.details(),
    )
    assert list(event.target_ids) == []
    assert json.loads(event.request_json) == {
        "unparsed": refused.details().removeprefix("request: ")  # type: ignore[union-attr]
    }


async def test_a_call_without_valid_credentials_is_not_recorded(stub: FlowStub) -> None:
    """Anyone can send a call without a token: recording those would let anyone fill the trail."""
    for metadata in ((), bearer("not-a-token")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await events(stub) == []


async def test_operations_record_the_racks_and_the_submitted_tasks(stub: FlowStub) -> None:
    components = [pb.ComponentSpec(type=pb.COMPONENT_TYPE_POWERSHELF, name="ps")]
    rack = await stub.CreateRack(pb.CreateRackRequest(name="r1", components=components), metadata=OPERATOR)
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(id=rack.id)]))
    submitted = await stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target), metadata=OPERATOR)
    (event,) = await events(stub, method="PowerOnRack")
    assert [i.id for i in event.target_ids] == [rack.id.id, *(t.id for t in submitted.task_ids)]


async def test_an_id_in_another_spelling_is_recorded_once_as_the_id_it_names(
    stub: FlowStub, services: Services
) -> None:
    """The API takes any spelling of a UUID (upper case, braces, urn:uuid:, no hyphens), and the trail
    kept it as sent: the schedule was listed twice (as sent and as the id it names), and the dashboard's
    audit page showed the spelled id as a thing that no longer exists."""
    await services.inventory.create_rack("r1")
    schedule = await create_schedule(stub)
    canonical = schedule.id.id
    for spelling in (canonical.upper(), f"{{{canonical}}}", f"urn:uuid:{canonical}"):
        await stub.TriggerTaskSchedule(
            pb.TriggerTaskScheduleRequest(id=pb.UUID(id=spelling)), metadata=OPERATOR
        )
    triggers = await events(stub, method="TriggerTaskSchedule")
    assert len(triggers) == 3
    for event in triggers:
        schedule_id, *task_ids = [i.id for i in event.target_ids]
        assert schedule_id == canonical and canonical not in task_ids
        assert all(i == str(uuid.UUID(i)) for i in task_ids)


async def test_a_trigger_and_its_replay_name_its_run(stub: FlowStub, services: Services) -> None:
    """A trigger's answer names its run (`run_id`), so its row does, and the row of a call again with its
    request id (`replayed`) names the same: the trail by run finds the calls that answered it."""
    await services.inventory.create_rack("r1")
    schedule = await create_schedule(stub)
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id="req-1")
    first = await stub.TriggerTaskSchedule(trigger, metadata=OPERATOR)
    again = await stub.TriggerTaskSchedule(trigger, metadata=OPERATOR)
    assert again.replayed and again.run_id == first.run_id
    rows = await events(stub, target=first.run_id)
    assert [(e.method, e.outcome) for e in rows] == [("TriggerTaskSchedule", "OK")] * 2


async def test_schedule_changes_carry_before_and_after(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    await services.inventory.create_rack("r1")
    await services.inventory.create_rack("r2")
    schedule = await create_schedule(stub)
    clock.advance(SECOND)
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id), metadata=OPERATOR)
    clock.advance(SECOND)
    add_r2 = pb.AddTaskScheduleScopeRequest(schedule_id=schedule.id, target_spec=racks_spec("r2"))
    added = await stub.AddTaskScheduleScope(add_r2, metadata=OPERATOR)
    clock.advance(SECOND)
    await stub.RemoveTaskScheduleScope(
        pb.RemoveTaskScheduleScopeRequest(scope_id=added.scopes[0].id), metadata=OPERATOR
    )
    clock.advance(SECOND)
    await stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=schedule.id), metadata=OPERATOR)

    delete, remove, add, pause, create = await events(stub)

    def snapshots(event: pb.AuditEvent) -> tuple[dict[str, object] | None, dict[str, object] | None]:
        def load(text: str) -> dict[str, object] | None:
            return json.loads(text) if text else None

        return load(event.schedule_before_json), load(event.schedule_after_json)

    before, after = snapshots(create)
    assert before is None and after is not None
    assert (after["id"], after["name"], after["enabled"]) == (schedule.id.id, "nightly", True)
    before, after = snapshots(pause)
    assert before is not None and after is not None
    assert (before["enabled"], after["enabled"]) == (True, False)
    before, after = snapshots(add)
    assert before is not None and after is not None
    assert (len(before["scopes"]), len(after["scopes"])) == (1, 2)  # type: ignore[arg-type]
    before, after = snapshots(remove)
    assert before is not None and after is not None
    assert (len(before["scopes"]), len(after["scopes"])) == (2, 1)  # type: ignore[arg-type]
    assert [i.id for i in remove.target_ids] == [added.scopes[0].id.id, schedule.id.id]
    before, after = snapshots(delete)
    assert before is not None and after is None


async def test_a_trigger_that_submits_nothing_is_recorded_as_failed_with_its_message(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    await services.inventory.create_rack("r1", components=[ComponentSpec(ComponentType.POWERSHELF, "ps")])
    schedule = await create_schedule(stub)
    clock.advance(SECOND)
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id), metadata=OPERATOR)
    clock.advance(SECOND)
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the first trigger's task holds the rack
        await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id), metadata=OPERATOR)

    failed, succeeded, _create = await events(stub)
    assert (succeeded.method, succeeded.outcome) == ("TriggerTaskSchedule", "OK")
    assert (failed.method, failed.outcome) == ("TriggerTaskSchedule", "FAILED_PRECONDITION")
    assert failed.error == refused.value.details() and "submitted no task" in failed.error
    assert [i.id for i in failed.target_ids] == [schedule.id.id]
    before, after = json.loads(failed.schedule_before_json), json.loads(failed.schedule_after_json)
    assert after["last_run_at"] != before["last_run_at"]  # it fired all the same


async def test_a_trigger_sent_again_with_its_request_id_is_recorded_ok_with_the_same_targets(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    await services.inventory.create_rack("r1", components=[ComponentSpec(ComponentType.POWERSHELF, "ps")])
    schedule = await create_schedule(stub)
    request = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id="change-4711")
    first = await stub.TriggerTaskSchedule(request, metadata=OPERATOR)
    clock.advance(SECOND)
    again = await stub.TriggerTaskSchedule(request, metadata=OPERATOR)  # fires nothing: the same answer

    assert list(again.task_ids) == list(first.task_ids) and len(first.task_ids) == 1
    repeated, fired, _create = await events(stub)
    for event in (repeated, fired):
        assert (event.method, event.outcome) == ("TriggerTaskSchedule", "OK")
        assert json.loads(event.request_json)["request_id"] == "change-4711"
    assert [i.id for i in repeated.target_ids] == [i.id for i in fired.target_ids]
    assert first.task_ids[0].id in {i.id for i in fired.target_ids}


async def test_list_filters_pages_and_counts_newest_first(stub: FlowStub, clock: FakeClock) -> None:
    for name in ("r1", "r2", "r3"):
        await stub.CreateRack(pb.CreateRackRequest(name=name), metadata=OPERATOR)
        clock.advance(timedelta(minutes=1))
    listed = await stub.ListRacks(pb.ListRacksRequest(), metadata=VIEWER)
    assert [r.name for r in listed.racks] == ["r1", "r2", "r3"]
    await stub.DeleteRack(pb.DeleteRackRequest(id=listed.racks[0].id), metadata=OPERATOR)

    newest_first = await events(stub)
    assert [e.method for e in newest_first] == ["DeleteRack", "CreateRack", "CreateRack", "CreateRack"]
    assert [json.loads(e.request_json)["name"] for e in newest_first[1:]] == ["r3", "r2", "r1"]

    page = await stub.ListAuditEvents(
        pb.ListAuditEventsRequest(method="CreateRack", pagination=pb.Pagination(offset=1, limit=1)),
        metadata=VIEWER,
    )
    assert page.total == 3
    assert [json.loads(e.request_json)["name"] for e in page.events] == ["r2"]

    since = Timestamp()
    since.FromDatetime(START + timedelta(minutes=1))
    assert len(await events(stub, since=since)) == 3
    assert len(await events(stub, principal="oncall")) == 4
    assert await events(stub, principal="dashboard") == []


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.ListAuditEventsRequest(method="DropAllTables"), "method"),
        (pb.ListAuditEventsRequest(principal="x" * 256), "principal"),
        (pb.ListAuditEventsRequest(pagination=pb.Pagination(limit=100_000)), "pagination.limit"),
        (pb.ListAuditEventsRequest(target=pb.UUID(id="rack-7")), "target: 'rack-7' is not a UUID"),
        (pb.ListAuditEventsRequest(target=pb.UUID()), "target: an id is required"),
    ],
)
async def test_bad_filters_are_invalid_argument(
    stub: FlowStub, request_: pb.ListAuditEventsRequest, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ListAuditEvents(request_, metadata=VIEWER)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(field)


async def test_an_audit_failure_does_not_fail_the_mutation(
    stub: FlowStub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("audit table is gone")

    monkeypatch.setattr(audit_store, "insert_events", broken)
    failures = metrics.AUDIT_WRITE_FAILURES._value.get()
    with caplog.at_level(logging.ERROR):
        rack = await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=OPERATOR)
    assert rack.name == "r1"
    assert "AUDIT WRITE FAILED: CreateRack by oncall" in caplog.text
    assert metrics.AUDIT_WRITE_FAILURES._value.get() == failures + 1
    monkeypatch.undo()
    assert await events(stub) == []


async def read_back(db: Database, schedule_id: str) -> dict[str, object] | None:
    async with db.read() as conn:
        return await audit_store.schedule_snapshot(conn, uuid.UUID(schedule_id))


async def stored_events(db: Database) -> list[AuditEvent]:
    async with db.read() as conn:
        found, _ = await audit_store.list_events(conn)
    return found


async def test_the_after_snapshot_is_what_a_read_back_gives(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    await services.inventory.create_rack("r1")
    await services.inventory.create_rack("r2")
    schedule = await create_schedule(stub)
    create_after = await read_back(services.db, schedule.id.id)
    clock.advance(SECOND)
    add_r2 = pb.AddTaskScheduleScopeRequest(schedule_id=schedule.id, target_spec=racks_spec("r2"))
    await stub.AddTaskScheduleScope(add_r2, metadata=OPERATOR)
    add, create = await stored_events(services.db)
    assert create.schedule_before is None
    assert create.schedule_after == create_after and create_after is not None
    assert add.schedule_before == create_after
    assert add.schedule_after == await read_back(services.db, schedule.id.id)
    assert len(add.schedule_after["scopes"]) == 2  # type: ignore[index]


async def test_concurrent_events_share_one_insert_and_are_committed_when_recorded(
    stub: FlowStub, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await services.inventory.create_rack("r1")
    schedules = [await create_schedule(stub, name=f"s{i}") for i in range(3)]
    inserts: list[int] = []
    insert_events = audit_store.insert_events

    async def counted(conn: AsyncConnection, written: Sequence[AuditEvent]) -> None:
        inserts.append(len(written))
        await insert_events(conn, written)

    monkeypatch.setattr(audit_store, "insert_events", counted)
    interceptor = audit_interceptor.AuditInterceptor(services.audit)
    principal = current_principal.set(Principal("oncall", Role.OPERATOR, "token"))
    calls = [
        *(
            interceptor.record(
                "PauseTaskSchedule",
                pb.PauseTaskScheduleRequest(id=s.id),
                None,
                "OK",
                "",
                uuid.UUID(s.id.id),
                None,
            )
            for s in schedules
        ),
        interceptor.record("CreateRack", pb.CreateRackRequest(name="r2"), None, "OK", "", None, None),
    ]
    await asyncio.gather(*calls)
    current_principal.reset(principal)

    assert inserts == [4]
    recorded = await stored_events(services.db)  # committed by the time record() returned
    after = {e.request["id"]["id"]: e.schedule_after for e in recorded if e.method == "PauseTaskSchedule"}
    assert after == {s.id.id: await read_back(services.db, s.id.id) for s in schedules}
    (rack,) = [e for e in recorded if e.method == "CreateRack"]
    assert (rack.principal, rack.schedule_before, rack.schedule_after) == ("oncall", None, None)


async def test_close_waits_for_the_events_of_cancelled_calls(services: Services) -> None:
    interceptor = audit_interceptor.AuditInterceptor(services.audit)
    recording = asyncio.create_task(
        interceptor.record("CreateRack", pb.CreateRackRequest(name="r1"), None, "CANCELLED", "", None, None)
    )
    await asyncio.sleep(0)  # queued
    recording.cancel()
    await services.audit.close()
    assert recording.cancelled()
    assert [(e.method, e.outcome) for e in await stored_events(services.db)] == [("CreateRack", "CANCELLED")]


async def test_resuming_and_cancelling_a_rollout_are_recorded_with_the_run(stub: FlowStub) -> None:
    components = [pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="c1")]
    await stub.CreateRack(pb.CreateRackRequest(name="r1", components=components), metadata=OPERATOR)
    config = pb.ScheduleConfig(name="fw", spec=HOURLY, rollout=pb.RolloutPolicy(max_concurrent_racks=1))
    operation = pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=racks_spec("r1")))
    schedule = await stub.CreateTaskSchedule(
        pb.CreateTaskScheduleRequest(schedule=config, operation=operation), metadata=OPERATOR
    )
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id), metadata=OPERATOR)
    listed = await stub.ListTaskScheduleRuns(
        pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id), metadata=VIEWER
    )
    run_id = listed.runs[0].id
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.ResumeTaskScheduleRun(pb.ResumeTaskScheduleRunRequest(id=run_id), metadata=OPERATOR)
    await stub.CancelTaskScheduleRun(pb.CancelTaskScheduleRunRequest(id=run_id), metadata=OPERATOR)
    await stub.GetTaskScheduleRun(
        pb.GetTaskScheduleRunRequest(id=run_id), metadata=VIEWER
    )  # a read: not recorded
    (cancel,) = await events(stub, method="CancelTaskScheduleRun")
    (resume,) = await events(stub, method="ResumeTaskScheduleRun")
    assert not await events(stub, method="GetTaskScheduleRun")
    assert (cancel.method, cancel.outcome, cancel.principal) == ("CancelTaskScheduleRun", "OK", "oncall")
    assert run_id in cancel.target_ids
    assert (resume.method, resume.outcome) == ("ResumeTaskScheduleRun", "FAILED_PRECONDITION")
    assert "only a halted rollout can be resumed" in resume.error
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await stub.CancelTaskScheduleRun(pb.CancelTaskScheduleRunRequest(id=run_id), metadata=VIEWER)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


def components_spec(*ids: pb.UUID) -> pb.OperationTargetSpec:
    targets = [pb.ComponentTarget(id=i) for i in ids]
    return pb.OperationTargetSpec(components=pb.ComponentTargets(targets=targets))


async def create_scoped(stub: FlowStub, name: str, targets: pb.OperationTargetSpec) -> pb.TaskSchedule:
    request = pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(name=name, spec=HOURLY),
        operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=targets)),
    )
    schedule: pb.TaskSchedule = await stub.CreateTaskSchedule(request, metadata=OPERATOR)
    return schedule


async def scope_ids(stub: FlowStub, schedule: pb.TaskSchedule) -> list[str]:
    request = pb.ListTaskScheduleScopesRequest(schedule_id=schedule.id)
    return [s.id.id for s in (await stub.ListTaskScheduleScopes(request, metadata=VIEWER)).scopes]


def history(trail: Sequence[pb.AuditEvent], target_id: pb.UUID) -> list[str]:
    """The methods of the events that name `target_id`, newest first: a thing's history in the trail, as
    an operator reads it (the audit page's targets, `rackflow audit -o json`)."""
    return [e.method for e in trail if target_id.id in [i.id for i in e.target_ids]]


async def test_delete_rack_names_each_schedule_whose_scope_it_changed(
    stub: FlowStub, clock: FakeClock
) -> None:
    r1 = await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=OPERATOR)
    await stub.CreateRack(pb.CreateRackRequest(name="r2"), metadata=OPERATOR)
    nightly = await create_scoped(stub, "nightly", racks_spec("r1", "r2"))
    weekly = await create_scoped(stub, "weekly", racks_spec("r1"))
    untouched = await create_scoped(stub, "r2-only", racks_spec("r2"))
    entries = {s.name: await scope_ids(stub, s) for s in (nightly, weekly)}
    clock.advance(SECOND)

    await stub.DeleteRack(pb.DeleteRackRequest(id=r1.id), metadata=OPERATOR)

    trail = await events(stub)
    (delete,) = [e for e in trail if e.method == "DeleteRack"]
    rack_id, *schedule_ids = [i.id for i in delete.target_ids]
    assert rack_id == r1.id.id
    assert sorted(schedule_ids) == sorted([nightly.id.id, weekly.id.id])
    changes = sorted(json.loads(delete.changes_json), key=lambda change: change["schedule_name"])
    assert changes == [
        {
            "scope_entry": "removed",
            "schedule_id": schedule.id.id,
            "schedule_name": schedule.name,
            "scope_id": scope_id,
            "rack_id": r1.id.id,
        }
        for schedule, scope_id in [(nightly, entries["nightly"][0]), (weekly, entries["weekly"][0])]
    ]
    assert (await scope_ids(stub, nightly)) == [entries["nightly"][1]]  # what the event says went, went
    assert history(trail, nightly.id) == history(trail, weekly.id) == ["DeleteRack", "CreateTaskSchedule"]
    assert history(trail, untouched.id) == ["CreateTaskSchedule"]


async def test_the_trail_by_target_is_a_things_history_in_any_spelling_page_by_page(
    stub: FlowStub, clock: FakeClock
) -> None:
    """`target` lists what happened to one thing, newest first: a schedule's own RPCs and the DeleteRack
    that took a rack out of its scope, which its request does not name; the id in any spelling the API
    takes, as the trail writes ids; keyset pages as without it."""
    r1 = await stub.CreateRack(pb.CreateRackRequest(name="r1"), metadata=OPERATOR)
    await stub.CreateRack(pb.CreateRackRequest(name="r2"), metadata=OPERATOR)
    nightly = await create_scoped(stub, "nightly", racks_spec("r1", "r2"))
    clock.advance(SECOND)
    await stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=nightly.id), metadata=OPERATOR)
    clock.advance(SECOND)
    await create_scoped(stub, "weekly", racks_spec("r2"))
    clock.advance(SECOND)
    await stub.DeleteRack(pb.DeleteRackRequest(id=r1.id), metadata=OPERATOR)

    spellings = [
        nightly.id.id,
        nightly.id.id.upper(),
        "{" + nightly.id.id + "}",
        nightly.id.id.replace("-", ""),
    ]
    for spelling in spellings:
        listed = await stub.ListAuditEvents(
            pb.ListAuditEventsRequest(target=pb.UUID(id=spelling)), metadata=VIEWER
        )
        assert [e.method for e in listed.events] == ["DeleteRack", "PauseTaskSchedule", "CreateTaskSchedule"]
        assert (listed.total, listed.total_capped) == (3, False)
    assert [e.method for e in await events(stub, target=r1.id)] == ["DeleteRack", "CreateRack"]
    assert [e.method for e in await events(stub, target=r1.id, method="CreateRack")] == ["CreateRack"]
    assert await events(stub, target=pb.UUID(id=str(uuid.uuid4()))) == []

    pages: list[str] = []
    token = ""
    while True:
        asked = pb.Pagination(limit=2, page_token=token)
        page = await stub.ListAuditEvents(
            pb.ListAuditEventsRequest(target=nightly.id, pagination=asked), metadata=VIEWER
        )
        pages.append(",".join(e.method for e in page.events))
        token = page.next_page_token
        if not token:
            break
    assert pages == ["DeleteRack,PauseTaskSchedule", "CreateTaskSchedule"]


async def test_remove_component_names_the_schedules_it_narrowed_or_emptied(stub: FlowStub) -> None:
    components = [pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=n) for n in ("a", "b")]
    rack = await stub.CreateRack(pb.CreateRackRequest(name="r1", components=components), metadata=OPERATOR)
    a, b = (c.id for c in rack.components)
    both = await create_scoped(stub, "a-and-b", components_spec(a, b))
    only_a = await create_scoped(stub, "only-a", components_spec(a))
    whole = await create_scoped(stub, "whole-r1", racks_spec("r1"))
    entries = {s.name: await scope_ids(stub, s) for s in (both, only_a)}

    await stub.RemoveComponent(pb.RemoveComponentRequest(id=a), metadata=OPERATOR)

    trail = await events(stub)
    (remove,) = [e for e in trail if e.method == "RemoveComponent"]
    component_id, *schedule_ids = [i.id for i in remove.target_ids]
    assert component_id == a.id
    assert sorted(schedule_ids) == sorted([both.id.id, only_a.id.id])
    changes = sorted(json.loads(remove.changes_json), key=lambda change: change["schedule_name"])
    assert changes == [
        {
            "scope_entry": "narrowed",
            "schedule_id": both.id.id,
            "schedule_name": "a-and-b",
            "scope_id": entries["a-and-b"][0],
            "rack_id": rack.id.id,
            "components_left": [b.id],
        },
        {
            "scope_entry": "removed",
            "schedule_id": only_a.id.id,
            "schedule_name": "only-a",
            "scope_id": entries["only-a"][0],
            "rack_id": rack.id.id,
        },
    ]
    assert history(trail, both.id) == history(trail, only_a.id) == ["RemoveComponent", "CreateTaskSchedule"]
    assert history(trail, whole.id) == ["CreateTaskSchedule"]
    assert (await events(stub, method="CreateRack"))[0].changes_json == ""  # nothing beyond its request


async def test_update_maintenance_window_names_the_deferred_tasks_it_moved(
    stub: FlowStub, services: Services, clock: FakeClock
) -> None:
    """The window's edit moves the task a DEFER firing deferred to its opening; its event names the task
    and says where it went (`rackflow.tasks.deferrals`)."""
    env = Env(services.db, clock, services)
    r1 = await env.rack("r1")
    window = await services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    (result,) = await dispatch_at(env, START + timedelta(hours=1))
    (outcome,) = result.outcomes
    clock.advance(timedelta(hours=1))

    request = pb.UpdateMaintenanceWindowRequest(
        id=pb.UUID(id=str(window.id)),
        window=pb.MaintenanceWindow(recurring=pb.RecurringWindow(cron="0 5 * * *", duration="1h")),
        update_mask=FieldMask(paths=["window.when"]),
    )
    await stub.UpdateMaintenanceWindow(request, metadata=OPERATOR)

    (update,) = [e for e in await events(stub) if e.method == "UpdateMaintenanceWindow"]
    assert [i.id for i in update.target_ids] == [str(window.id), str(r1.id), str(outcome.task_id)]
    assert json.loads(update.changes_json) == [
        {
            "deferred_task": "moved",
            "task_id": str(outcome.task_id),
            "run_id": str(result.run_id),
            "rack_id": str(r1.id),
            "not_before": "2026-03-03T05:00:00Z",
            "not_after": "2026-03-03T06:00:00Z",
        }
    ]
