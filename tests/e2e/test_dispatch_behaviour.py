"""Dispatch behaviour end to end: one real `rackflow serve`, simulator tasks that outlast the interval.

Runs on SQLite and on PostgreSQL. Simulator steps take STEP_S per component, so a rack's task lasts
components × STEP_S; schedules fire every second.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, rfc3339, schedule_request, wait_until

pytestmark = [
    pytest.mark.slow,
]

STEP_S = 0.4
INTERVAL = pb.SCHEDULE_SPEC_TYPE_INTERVAL


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(
        served_db_url,
        tmp_path_factory.mktemp("dispatch"),
        args=["--dispatch-interval", "200ms"],
        env={"RACKFLOW_SIM_STEP_SECONDS": str(STEP_S)},
    )
    yield proc
    assert proc.stop() == 0, proc.output


@pytest.fixture
def stub(server: ServerProcess) -> flow_pb2_grpc.FlowStub:
    return server.stub()


def _runs(stub: flow_pb2_grpc.FlowStub, schedule: pb.TaskSchedule) -> list[pb.TaskScheduleRun]:
    return list(stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs)


def _tasks(stub: flow_pb2_grpc.FlowStub, schedule: pb.TaskSchedule) -> list[pb.Task]:
    return list(stub.ListTasks(pb.ListTasksRequest(schedule_id=schedule.id)).tasks)


def _outcomes(runs: list[pb.TaskScheduleRun]) -> list[str]:
    return [o.outcome for run in runs for o in run.outcomes]


def test_skip_leaves_out_a_scope_whose_task_is_still_running(stub: flow_pb2_grpc.FlowStub) -> None:
    create_racks(stub, ["skip-a"], components_per_rack=8)  # a task lasts ~3.2 s; the interval is 1 s
    schedule = stub.CreateTaskSchedule(schedule_request("skip", ["skip-a"], spec_type=INTERVAL, spec="1s"))
    wait_until(
        lambda: "skipped_overlap" in _outcomes(_runs(stub, schedule)), timeout=15, what="a skipped firing"
    )
    stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    tasks = _tasks(stub, schedule)
    assert all(t.status != pb.TASK_STATUS_WAITING for t in tasks), "SKIP must never queue"
    assert len(tasks) == _outcomes(_runs(stub, schedule)).count("submitted")


def test_queue_submits_behind_the_running_task(stub: flow_pb2_grpc.FlowStub) -> None:
    create_racks(stub, ["queue-a"], components_per_rack=8)
    schedule = stub.CreateTaskSchedule(
        schedule_request("queue", ["queue-a"], spec_type=INTERVAL, spec="1s", overlap=pb.OVERLAP_POLICY_QUEUE)
    )
    wait_until(
        lambda: any(t.status == pb.TASK_STATUS_WAITING for t in _tasks(stub, schedule)),
        timeout=15,
        what="a waiting task",
    )
    stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    assert "skipped_overlap" not in _outcomes(_runs(stub, schedule))


def test_per_scope_skip_fires_the_idle_racks(stub: flow_pb2_grpc.FlowStub) -> None:
    create_racks(stub, [f"ps-{i}" for i in range(4)], components_per_rack=1)
    create_racks(stub, ["ps-busy"], components_per_rack=8)
    schedule = stub.CreateTaskSchedule(
        schedule_request(
            "per-scope", [*(f"ps-{i}" for i in range(4)), "ps-busy"], spec_type=INTERVAL, spec="1s"
        )
    )
    busy_id = _rack_id(stub, "ps-busy").id

    def four_fired_one_skipped() -> bool:
        for run in _runs(stub, schedule):
            kinds = {o.rack_id.id: o.outcome for o in run.outcomes}
            if list(kinds.values()).count("submitted") == 4 and kinds.get(busy_id) == "skipped_overlap":
                return True
        return False

    wait_until(four_fired_one_skipped, timeout=15, what="a firing on 4 racks with the busy one skipped")
    stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))


def _rack_id(stub: flow_pb2_grpc.FlowStub, name: str) -> pb.UUID:
    racks = stub.ListRacks(pb.ListRacksRequest()).racks
    return next(r.id for r in racks if r.name == name)


def test_empty_scope_advances_without_tasks(stub: flow_pb2_grpc.FlowStub) -> None:
    create_racks(stub, ["empty-a"])
    schedule = stub.CreateTaskSchedule(schedule_request("empty", ["empty-a"], spec_type=INTERVAL, spec="1h"))
    stub.DeleteRack(pb.DeleteRackRequest(id=_rack_id(stub, "empty-a")))  # the scope goes with the rack
    schedule = stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(
            id=schedule.id,
            schedule=pb.ScheduleConfig(spec=pb.ScheduleSpec(type=INTERVAL, spec="1s")),
            update_mask={"paths": ["schedule.spec"]},
        )
    )
    wait_until(lambda: len(_runs(stub, schedule)) >= 2, timeout=30, what="two firings of the empty schedule")
    stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    assert _outcomes(_runs(stub, schedule)) == []
    assert _tasks(stub, schedule) == []
    after = stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert after.last_run_at.ToDatetime() > schedule.created_at.ToDatetime()


def test_one_time_is_consumed_even_when_every_submission_fails(stub: flow_pb2_grpc.FlowStub) -> None:
    (rack,) = create_racks(stub, ["fail-a"], components_per_rack=8)
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="fail-a")]))
    stub.BringUpRack(pb.BringUpRackRequest(target_spec=target))  # bring-up conflicts with everything
    past = rfc3339(datetime.now(UTC) - timedelta(seconds=1))
    schedule = stub.CreateTaskSchedule(
        schedule_request("fail-once", ["fail-a"], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=past)
    )
    wait_until(
        lambda: bool(_runs(stub, schedule)) and _runs(stub, schedule)[0].state == "completed",
        timeout=30,
        what="the one-time firing",
    )
    (run,) = _runs(stub, schedule)
    assert [o.outcome for o in run.outcomes] == ["failed"]
    assert run.outcomes[0].error
    after = stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert not after.enabled and not after.HasField("next_run_at")
    with pytest.raises(grpc.RpcError) as err:
        stub.ResumeTaskSchedule(pb.ResumeTaskScheduleRequest(id=schedule.id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rack.id.id


def test_paused_schedule_never_fires(stub: flow_pb2_grpc.FlowStub) -> None:
    """Made every second only once paused: created so, a slow pause (a busy machine) let it fire first. A
    schedule beside it, every second too and made after it, fires twice meanwhile: the dispatcher has
    looked past the paused one's time (a sleep may end, on a busy machine, before it looked at all)."""
    create_racks(stub, ["paused-a", "paused-beside"])
    schedule = stub.CreateTaskSchedule(
        schedule_request("paused", ["paused-a"], spec_type=INTERVAL, spec="1h")
    )
    stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    every_second = stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(
            id=schedule.id,
            schedule=pb.ScheduleConfig(spec=pb.ScheduleSpec(type=INTERVAL, spec="1s")),
            update_mask={"paths": ["schedule.spec"]},
        )
    )
    assert not every_second.enabled
    beside = stub.CreateTaskSchedule(
        schedule_request("paused-beside", ["paused-beside"], spec_type=INTERVAL, spec="1s")
    )
    try:
        wait_until(lambda: len(_runs(stub, beside)) >= 2, timeout=30, what="two firings of the one beside")
    finally:
        stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=beside.id))
    assert _runs(stub, schedule) == []
    assert _tasks(stub, schedule) == []


def test_a_pause_ends_by_itself_at_resume_at(stub: flow_pb2_grpc.FlowStub) -> None:
    """The serving process resumes the schedule at `resume_at` (as ResumeTaskSchedule would: it fires again)
    and records that in the audit trail as done by rackflow itself."""
    create_racks(stub, ["pause-a"], components_per_rack=1)
    schedule = stub.CreateTaskSchedule(
        schedule_request("pause-end", ["pause-a"], spec_type=INTERVAL, spec="1s")
    )
    request = pb.PauseTaskScheduleRequest(id=schedule.id, reason="PSU swap")
    request.resume_at.FromDatetime(datetime.now(UTC) + timedelta(seconds=3))
    paused = stub.PauseTaskSchedule(request)
    assert not paused.enabled and paused.pause_reason == "PSU swap"
    fired_while_paused = len(_runs(stub, schedule))

    def resumed() -> bool:
        return stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)).enabled

    wait_until(resumed, timeout=20, what="the pause to end at resume_at")
    after = stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id))
    assert after.pause_reason == "" and not after.HasField("resume_at")
    assert when_of(after.updated_at) >= when_of(paused.resume_at)  # not before its end
    wait_until(lambda: len(_runs(stub, schedule)) > fired_while_paused, timeout=15, what="a firing after")
    events = stub.ListAuditEvents(pb.ListAuditEventsRequest(method="ResumeTaskSchedule")).events
    # This module's server is shared: other tests' resumes (a refused one included) are in the trail too.
    mine = [e for e in events if schedule.id.id in [t.id for t in e.target_ids]]
    assert [(e.principal, [t.id for t in e.target_ids]) for e in mine] == [("rackflow", [schedule.id.id])]


def when_of(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)
