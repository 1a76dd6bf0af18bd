"""A trigger's and a retry's answer say whether they are the answer of an earlier call with the same request
id (`replayed`: it fired nothing), and a trigger's which run it is and when it fired, on both databases: so
a client that sent a call again after a lost answer can tell its operator what happened
(docs/SCHEDULES.md, "A trigger whose COMMIT goes unanswered")."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from rackflow.clock import FakeClock
from rackflow.domain.inventory import Rack
from rackflow.domain.tasks import TaskStatus
from rackflow.services import Services
from rackflow.store import tasks as task_store
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.test_schedules_api import clock, create, racks, when

__all__ = ["clock", "racks"]


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
