"""Every list command's title counts in words: `1 budget`, `1 of 1 run`, `2 of 2 runs`, `1 of 5 tasks`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from click.testing import Result

from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_checks import a_check
from tests.unit.test_cli_commands import RACK_ID, FakeClient, a_budget, a_schedule, a_task, fake, run
from tests.unit.test_cli_notify import a_channel
from tests.unit.test_cli_windows import a_window

__all__ = ["fake", "run"]


def _one(total: int) -> list[tuple[tuple[str, ...], str, Any, str]]:
    """(command, client method, its answer holding one row of `total`, the title's noun for that total)."""
    many = total != 1
    return [
        (
            ("rack", "list"),
            "list_racks",
            pb.ListRacksResponse(racks=[pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-01")], total=total),
            "racks" if many else "rack",
        ),
        (
            ("task", "list"),
            "list_tasks",
            pb.ListTasksResponse(tasks=[a_task(pb.TASK_STATUS_COMPLETED)], total=total),
            "tasks" if many else "task",
        ),
        (
            ("schedule", "list"),
            "list_schedules",
            pb.ListTaskSchedulesResponse(task_schedules=[a_schedule()], total=total),
            "schedules" if many else "schedule",
        ),
        (
            ("schedule", "runs", "nightly"),
            "list_runs",
            pb.ListTaskScheduleRunsResponse(runs=[pb.TaskScheduleRun(id=pb.UUID(id=RACK_ID))], total=total),
            "runs" if many else "run",
        ),
        (
            ("schedule", "scope", "list", "nightly"),
            "list_scopes",
            pb.ListTaskScheduleScopesResponse(
                scopes=[pb.TaskScheduleScope(rack_id=pb.UUID(id=RACK_ID))], total=total
            ),
            "scope entries" if many else "scope entry",
        ),
        (
            ("audit",),
            "list_audit_events",
            pb.ListAuditEventsResponse(events=[pb.AuditEvent(principal="ann")], total=total),
            "events" if many else "event",
        ),
    ]


@pytest.mark.parametrize("total", [1, 5])
def test_a_paged_list_s_title_agrees_with_its_total(
    fake: FakeClient, run: Callable[..., Result], total: int
) -> None:
    for args, method, answer, noun in _one(total):
        fake.answers[method] = answer
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
        assert result.stdout.splitlines()[0] == f"1 of {total} {noun}", (args, result.stdout)


def test_a_capped_total_counts_as_many(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_tasks"] = pb.ListTasksResponse(
        tasks=[a_task(pb.TASK_STATUS_COMPLETED)], total=1, total_capped=True
    )
    assert run("task", "list").stdout.splitlines()[0] == "1 of 1+ tasks"


@pytest.mark.parametrize(
    ("args", "method", "answer", "one"),
    [
        (
            ("budget", "list"),
            "list_budgets",
            pb.ListOperationBudgetsResponse(budgets=[a_budget()]),
            "1 budget",
        ),
        (("check", "list"), "list_checks", pb.ListPreflightChecksResponse(checks=[a_check()]), "1 check"),
        (
            ("notify", "list"),
            "list_channels",
            pb.ListNotificationChannelsResponse(channels=[a_channel()]),
            "1 channel",
        ),
        (
            ("window", "list"),
            "list_windows",
            pb.ListMaintenanceWindowsResponse(windows=[a_window()]),
            "1 window",
        ),
    ],
)
def test_a_whole_list_s_title_is_singular_for_one(
    fake: FakeClient, run: Callable[..., Result], args: tuple[str, ...], method: str, answer: Any, one: str
) -> None:
    fake.answers[method] = answer
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == one, result.stdout
    rows = getattr(answer, answer.DESCRIPTOR.fields[0].name)
    rows.extend([rows[0], rows[0]])
    assert run(*args).stdout.splitlines()[0] == one.replace("1", "3", 1) + "s"


def test_what_a_submission_submitted_is_counted_in_words(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """`submitted 1 task`, not `submitted 1 task(s)`, for a task and a schedule's trigger alike."""
    for args in (("task", "power-on", "--rack", "rack-01"), ("schedule", "trigger", "nightly")):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[0] == "submitted 1 task", result.stdout
    fake.answers["trigger_schedule"] = pb.SubmitTaskResponse(task_ids=[pb.UUID(id=RACK_ID)] * 2)
    assert run("schedule", "trigger", "nightly").stdout.splitlines()[0] == "submitted 2 tasks"
