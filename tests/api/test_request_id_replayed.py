"""A trigger's and a retry's answer say whether they are the answer of an earlier call with the same request
id (`replayed`: it fired nothing), and a trigger's which run it is and when it fired, on both databases: so
a client that sent a call again after a lost answer can tell its operator what happened
(docs/SCHEDULES.md, "A trigger whose COMMIT goes unanswered")."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from rackflow.api.errors import FIRED_AT_KEY, REPLAYED_KEY, RUN_ID_KEY
from rackflow.clock import FakeClock
from rackflow.domain.inventory import Rack
from rackflow.domain.tasks import TaskStatus
from rackflow.services import Services
from rackflow.store import tasks as task_store
from rackflow.timespec import format_rfc3339
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.test_schedules_api import clock, create, racks, seeded_racks, when

__all__ = ["clock", "racks", "seeded_racks"]


async def _runs(stub: FlowStub, schedule: pb.TaskSchedule) -> list[pb.TaskScheduleRun]:
    request = pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)
    return list((await stub.ListTaskScheduleRuns(request)).runs)


async def test_a_trigger_again_with_its_request_id_answers_replayed(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    schedule = await create(stub, "s", "r1", "r2")
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id="req-1")

    first = await stub.TriggerTaskSchedule(trigger)
    assert isinstance(services.clock, FakeClock)
    services.clock.advance(timedelta(minutes=5))
    again = await stub.TriggerTaskSchedule(trigger)

    (run,) = await _runs(stub, schedule)
    assert first.HasField("replayed") and not first.replayed
    assert again.HasField("replayed") and again.replayed
    assert list(again.task_ids) == list(first.task_ids) and len(first.task_ids) == 2
    # Both name the one run, and when it fired: the first call's time, not the second's.
    assert first.run_id == again.run_id == run.id
    assert when(first.fired_at) == when(again.fired_at) == when(run.fired_at)
    # Another id, or none, fires now: not replayed.
    plain = await create(stub, "plain", "r3")
    fresh = await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=plain.id))
    assert fresh.HasField("replayed") and not fresh.replayed and fresh.run_id.id
    (fresh_run,) = await _runs(stub, plain)
    assert fresh.run_id == fresh_run.id


async def test_a_trigger_awaiting_approval_names_its_run_and_replays(
    stub: FlowStub, racks: list[Rack]
) -> None:
    request = pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(
            name="fw",
            spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h"),
            approval=pb.ApprovalPolicy(required=True, timeout="4h"),
        ),
        operation=pb.ScheduledOperation(
            power_off=pb.PowerOffRackRequest(
                target_spec=pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")])),
                forced=True,
            )
        ),
    )
    schedule = await stub.CreateTaskSchedule(request)
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id="req-1")

    first = await stub.TriggerTaskSchedule(trigger)
    again = await stub.TriggerTaskSchedule(trigger)

    (run,) = await _runs(stub, schedule)
    assert run.state == "awaiting_approval"
    assert list(first.task_ids) == list(again.task_ids) == []
    assert (first.replayed, again.replayed) == (False, True)
    assert first.run_id == again.run_id == run.id


async def test_a_retry_again_with_its_request_id_answers_replayed(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    schedule = await create(stub, "s", "r1")
    (task_id,) = (await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))).task_ids
    (failed,) = await _runs(stub, schedule)
    async with services.db.transaction() as conn:
        await task_store.set_status(conn, [uuid.UUID(task_id.id)], TaskStatus.FAILED, now=datetime.now(UTC))
    retry = pb.RetryTaskScheduleRunRequest(id=failed.id, request_id="req-1")

    first = await stub.RetryTaskScheduleRun(retry)
    again = await stub.RetryTaskScheduleRun(retry)

    assert first.HasField("replayed") and not first.replayed
    assert again.HasField("replayed") and again.replayed
    assert again.id == first.id and again.retry_of == failed.id and again.fired_at == first.fired_at
    assert len(await _runs(stub, schedule)) == 2
    # Only the retry's answer says it: a run read is neither.
    read = await stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=first.id))
    assert not read.HasField("replayed")
    assert not any(r.HasField("replayed") for r in await _runs(stub, schedule))


def _trailing(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return {k: str(v) for k, v in (error.trailing_metadata() or ())}


async def test_a_refused_trigger_again_with_its_request_id_is_marked_replayed(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """A trigger whose every scope failed answers FAILED_PRECONDITION; sent again with its request id, the
    same refusal says it is that earlier call's answer: in its message (the run, when it fired, nothing new
    fired) and in its trailing metadata, read by the CLI and the HTTP API alike. The first says it fired."""
    schedule = await create(stub, "s", "r1", "r2")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))  # its tasks stay pending
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id, request_id="req-1")

    with pytest.raises(grpc.aio.AioRpcError) as first:
        await stub.TriggerTaskSchedule(trigger)
    assert isinstance(services.clock, FakeClock)
    services.clock.advance(timedelta(minutes=5))
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await stub.TriggerTaskSchedule(trigger)

    runs = await _runs(stub, schedule)
    assert len(runs) == 2  # the call again fired nothing
    (refused,) = [r for r in runs if all(o.outcome == "failed" for o in r.outcomes)]
    fired_at = when(refused.fired_at)
    for error in (first.value, again.value):
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "submitted no task" in (error.details() or "")
    assert _trailing(first.value) == {
        RUN_ID_KEY: refused.id.id,
        FIRED_AT_KEY: format_rfc3339(fired_at),
        REPLAYED_KEY: "false",
    }
    assert _trailing(again.value) == {
        RUN_ID_KEY: refused.id.id,
        FIRED_AT_KEY: format_rfc3339(fired_at),
        REPLAYED_KEY: "true",
    }
    assert f"run {refused.id.id}, fired at {format_rfc3339(fired_at)} by an earlier request" in (
        again.value.details() or ""
    )
    assert "earlier request" not in (first.value.details() or "")


async def _refused(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_only_a_trigger_that_submitted_nothing_names_a_run_in_its_error(
    stub: FlowStub, racks: list[Rack]
) -> None:
    """A bad request id, a refusal that records no run (a consumed one-time schedule) and a retry's refusal
    fired nothing and carry no run; the same request id on another schedule is that schedule's own first
    call, not a replay; a one-time schedule's refusal answered again is marked, not refused as consumed."""
    once = await create(
        stub, "once", "r1", spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2026-06-01T04:00:00Z"
    )
    other = await create(stub, "other", "r1")
    await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=other.id))  # r1 busy from here on
    trigger = pb.TriggerTaskScheduleRequest(id=once.id, request_id="req-1")

    bad = await _refused(
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id, request_id="a b"))
    )
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and _trailing(bad) == {}
    assert await _runs(stub, once) == []
    fired = await _refused(stub.TriggerTaskSchedule(trigger))
    again = await _refused(stub.TriggerTaskSchedule(trigger))  # consumed, yet answered as the first call
    consumed = await _refused(
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=once.id, request_id="x"))
    )

    (run,) = await _runs(stub, once)
    assert (_trailing(fired)[REPLAYED_KEY], _trailing(again)[REPLAYED_KEY]) == ("false", "true")
    assert _trailing(fired)[RUN_ID_KEY] == _trailing(again)[RUN_ID_KEY] == run.id.id
    assert consumed.code() == grpc.StatusCode.FAILED_PRECONDITION and _trailing(consumed) == {}
    # The same id on the other schedule fires there: its own first answer (a refusal, r1 being busy).
    elsewhere = await _refused(
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=other.id, request_id="req-1"))
    )
    assert _trailing(elsewhere)[REPLAYED_KEY] == "false"
    assert _trailing(elsewhere)[RUN_ID_KEY] not in (run.id.id, "")
    # A retry's refusal records no run: the first run's task is still active.
    first_run = next(r for r in await _runs(stub, other) if any(o.task_id.id for o in r.outcomes))
    retry = pb.RetryTaskScheduleRunRequest(id=first_run.id, request_id="req-2")
    for _ in range(2):
        still = await _refused(stub.RetryTaskScheduleRun(retry))
        assert still.code() == grpc.StatusCode.FAILED_PRECONDITION and _trailing(still) == {}
