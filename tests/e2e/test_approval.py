"""Approval with two real `rackflow serve` processes on one PostgreSQL (docs/SAFETY.md, "Approval"): a
dispatched firing awaits approval while both instances keep dispatching (every later firing is skipped,
none submits), the two-person rule holds by token on either instance, and when two approvers approve at
once through different instances the run starts once: one task per rack, and one of the two approvals is
told the run no longer awaits approval."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import servers, sql, start_server
from tests.e2e.fleet import schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

TOKENS = {"editor": "editor-secret-0a1b", "ann": "ann-secret-2c3d", "bob": "bob-secret-4e5f"}
ENV = {
    f"RACKFLOW_AUTH_TOKEN_{name.upper()}": f"approver:{hash_token(token)}" for name, token in TOKENS.items()
}
ARGS = ["--dispatch-interval", "200ms"]
RACKS = [f"ap-{i}" for i in range(4)]


def _as(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name]}"),)


def _runs(stub: flow_pb2_grpc.FlowStub, schedule: pb.TaskSchedule) -> list[pb.TaskScheduleRun]:
    request = pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)
    return list(stub.ListTaskScheduleRuns(request, metadata=_as("ann")).runs)


def test_an_approval_through_one_instance_starts_the_run_once(pg_db: str, tmp_path: Path) -> None:
    first = start_server(pg_db, tmp_path, name="first", args=["--migrate", *ARGS], env=ENV)
    try:
        with servers(pg_db, tmp_path, 1, args=ARGS, env=ENV) as (second,):
            a, b = first.stub(), second.stub()
            for name in RACKS:
                component = pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=f"{name}-c0")
                a.CreateRack(pb.CreateRackRequest(name=name, components=[component]), metadata=_as("editor"))
            request = schedule_request("fw", RACKS, spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1s")
            request.schedule.approval.CopyFrom(pb.ApprovalPolicy(required=True, timeout="1h"))
            schedule = a.CreateTaskSchedule(request, metadata=_as("editor"))

            # Both instances dispatch it every second: the first firing awaits approval, the later ones
            # are skipped for it, and nothing is submitted.
            wait_until(
                lambda: sum(r.state == "skipped" for r in _runs(b, schedule)) >= 3,
                timeout=60,
                what="firings skipped while the first awaits approval",
            )
            waiting = [r for r in _runs(b, schedule) if r.state == "awaiting_approval"]
            assert len(waiting) == 1, [r.state for r in _runs(b, schedule)]
            (run,) = waiting
            assert {o.outcome for o in run.outcomes} == {"pending"} and len(run.outcomes) == len(RACKS)
            assert sql(pg_db, "SELECT count(*) FROM tasks") == [(0,)]

            # The schedule's last editor may not approve it, on either instance.
            for stub in (a, b):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ApproveTaskScheduleRun(
                        pb.ApproveTaskScheduleRunRequest(id=run.id), metadata=_as("editor")
                    )
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]

            # Two approvers at once, one through each instance.
            answers: dict[str, object] = {}
            start = threading.Barrier(2)

            def approve(name: str, stub: flow_pb2_grpc.FlowStub) -> None:
                start.wait()
                try:
                    answers[name] = stub.ApproveTaskScheduleRun(
                        pb.ApproveTaskScheduleRunRequest(id=run.id, comment=name), metadata=_as(name)
                    )
                except grpc.RpcError as exc:
                    answers[name] = exc

            threads = [threading.Thread(target=approve, args=args) for args in (("ann", a), ("bob", b))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            errors = [v for v in answers.values() if isinstance(v, grpc.RpcError)]
            approved = [v for v in answers.values() if isinstance(v, pb.TaskScheduleRun)]
            assert len(errors) == 1 and len(approved) == 1, answers
            assert errors[0].code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
            assert "only a run awaiting approval can be approved" in errors[0].details()  # type: ignore[attr-defined]

            wait_until(
                lambda: (
                    b.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id), metadata=_as("ann")).state
                    == "completed"
                ),
                timeout=30,
                what="the approved run completing its submission",
            )
            done = a.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id), metadata=_as("ann"))
            assert {o.outcome for o in done.outcomes} == {"submitted"}
            assert len(done.approval.approvers) == 1
            per_rack = sql(pg_db, "SELECT rack_id, count(*) FROM tasks GROUP BY rack_id")
            assert len(per_rack) == len(RACKS) and {n for _, n in per_rack} == {1}, per_rack
            assert sql(pg_db, "SELECT DISTINCT run_id::text FROM tasks") == [(run.id.id,)]
            audited = sql(
                pg_db,
                "SELECT principal, outcome FROM audit_events WHERE method = 'ApproveTaskScheduleRun' "
                "ORDER BY principal, outcome",
            )
            winner = approved[0].approval.approvers[0].principal
            loser = "bob" if winner == "ann" else "ann"
            expected = [
                ("editor", "PERMISSION_DENIED"),
                ("editor", "PERMISSION_DENIED"),
                (winner, "OK"),
                (loser, "FAILED_PRECONDITION"),
            ]
            assert sorted(audited) == sorted(expected)
    finally:
        first.stop()
