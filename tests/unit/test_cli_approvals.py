"""`rackflow schedule create|update|trigger|runs` and `rackflow run approve|reject` with approvals, against a
fake client (tests/unit/test_cli_commands.py's)."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import Result

from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import NOW, RACK_ID, TASK_ID, FakeClient, fake, run, stamp

__all__ = ["fake", "run"]  # the fixtures


def _awaiting() -> pb.TaskScheduleRun:
    return pb.TaskScheduleRun(
        id=pb.UUID(id=TASK_ID),
        fired_at=stamp(NOW),
        trigger="manual",
        state="awaiting_approval",
        outcomes=[pb.ScopeOutcome(rack_id=pb.UUID(id=RACK_ID), outcome="pending")],
        approval=pb.RunApproval(
            expires_at=stamp(NOW), min_approvers=2, approvers=[pb.RunApprover(principal="ann", at=stamp(NOW))]
        ),
    )


def test_create_and_update_send_the_approval_policy(fake: FakeClient, run: Callable[..., Result]) -> None:
    result = run(
        "schedule", "create", "fw", "--interval", "1h", "--op", "power-off", "--rack", "rack-01",
        "--approval-timeout", "4h", "--min-approvers", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [(_, kwargs)] = fake.called("create_schedule")
    assert kwargs["approval"] == pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)

    fake.answers["get_schedule"] = pb.TaskSchedule(approval=pb.ApprovalPolicy(required=True, timeout="4h"))
    assert run("schedule", "update", "fw", "--min-approvers", "3").exit_code == 0
    assert run("schedule", "update", "fw", "--no-approval").exit_code == 0
    first, second = (kwargs for _, kwargs in fake.called("update_schedule"))
    assert first["approval"] == pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=3)
    assert second["approval"] is None and second["remove_approval"] is True
    refused = run("schedule", "update", "fw", "--no-approval", "--approval-timeout", "1h")
    assert refused.exit_code == 2 and "--no-approval removes the approval policy" in refused.output


def test_a_trigger_that_awaits_approval_says_so(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["trigger_schedule"] = pb.SubmitTaskResponse()
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[_awaiting()], total=1)
    result = run("schedule", "trigger", "fw")
    assert result.exit_code == 0, result.output
    assert "awaiting 1 more of 2 approver(s)" in result.output and "(approved by ann)" in result.output
    assert f"rackflow run approve {TASK_ID}" in result.output
    assert run("schedule", "trigger", "fw", "--approve").exit_code == 0
    assert [kwargs["approve"] for _, kwargs in fake.called("trigger_schedule")] == [False, True]


def test_runs_show_what_a_waiting_run_awaits(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[_awaiting()], total=1)
    result = run("schedule", "runs", "fw")
    assert result.exit_code == 0, result.output
    assert "awaiting_approval" in result.output and "awaiting 1 more of 2" in result.output


def test_run_approve_and_reject_call_the_server(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["approve_run"] = _awaiting()
    rejected = _awaiting()
    rejected.state = "rejected"
    rejected.approval.rejected_by = "bob"
    rejected.approval.comment = "not now"
    fake.answers["reject_run"] = rejected
    result = run("run", "approve", TASK_ID, "--comment", "ok")
    assert result.exit_code == 0, result.output
    assert "awaiting 1 more of 2 approver(s)" in result.output
    assert fake.called("approve_run") == [((TASK_ID, "ok"), {})]
    assert run("run", "reject", TASK_ID).exit_code == 2  # --comment is required
    result = run("run", "reject", TASK_ID, "--comment", "not now", "-o", "json")
    assert result.exit_code == 0 and json.loads(result.output)["approval"]["rejected_by"] == "bob"
    assert fake.called("reject_run") == [((TASK_ID, "not now"), {})]


def test_an_approved_run_shows_what_each_approver_said(fake: FakeClient, run: Callable[..., Result]) -> None:
    """`run approve --comment` is "for the run's record": `run show` (and the answer) says it beside its
    approver, as the dashboard's run page does, not only `-o json`."""
    approved = _awaiting()
    approved.state = "completed"
    approved.approval.approvers[0].comment = "checked CHG-2231"
    approved.approval.approvers.append(pb.RunApprover(principal="bob", at=stamp(NOW)))
    fake.answers["approve_run"] = approved
    result = run("run", "approve", TASK_ID)
    assert result.exit_code == 0, result.output
    assert "approved by ann (checked CHG-2231), bob" in " ".join(result.output.split())
