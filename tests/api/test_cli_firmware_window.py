"""The CLI against an in-process server over the `db` fixture, on a schedule whose firmware window ended:
`rackflow schedule show` says it is paused by rackflow and why, `schedule runs` shows the skipped slot
with the same reason, and `schedule resume` is refused, saying what to do instead; a rollout cancelled by
rackflow at the end says why."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result

from rackflow.cli.main import main
from rackflow.clock import Clock, FakeClock
from rackflow.domain.inventory import RackTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.timespec import ScheduleSpec, SpecType

pytestmark = pytest.mark.asyncio

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
ENDED = "its firmware window ended at 2026-03-02T13:30:00Z (its upgrade's end_time)"


@pytest.fixture
def clock() -> Clock:
    return FakeClock(START)


async def rackflow(address: str, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, ["--server", address, *args])


def words(text: str) -> str:
    """The text with its line breaks and runs of spaces (a table's wrapping) made single spaces."""
    return " ".join(text.split())


async def test_a_schedule_paused_because_its_firmware_window_ended_says_why_and_is_not_resumed(
    grpc_server: str, services: Services
) -> None:
    assert isinstance(services.clock, FakeClock)
    rack = await services.inventory.create_rack("r1")
    await services.schedules.create(
        name="fw",
        spec=ScheduleSpec(SpecType.INTERVAL, "1h"),
        overlap_policy=OverlapPolicy.SKIP,
        operation=Operation(
            OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=START + timedelta(minutes=90)
        ),
        queue=QueueOptions(),
        description="",
        target=TargetSpec(racks=(RackTarget(id=rack.id),)),
    )
    services.clock.advance(timedelta(hours=2))
    assert await Dispatcher(services.schedules, services.audit).poll_once() == 0

    shown = await rackflow(grpc_server, "schedule", "show", "fw")
    assert shown.exit_code == 0, shown.output
    assert "state paused" in words(shown.stdout)
    assert "paused 2026-03-02 14:00Z by rackflow" in words(shown.stdout)
    assert f"reason {ENDED}" in words(shown.stdout)

    runs = await rackflow(grpc_server, "schedule", "runs", "fw")
    assert runs.exit_code == 0, runs.output
    assert "skipped" in runs.stdout and ENDED in words(runs.stdout)

    resumed = await rackflow(grpc_server, "schedule", "resume", "fw")
    assert resumed.exit_code == 1, resumed.output
    assert words(resumed.stderr).startswith(
        "error: FAILED_PRECONDITION: id: schedule 'fw' cannot be resumed: its operation's end_time "
        "2026-03-02T13:30:00Z has passed (now 2026-03-02T14:00:00Z), so every firing would be too late to "
        "start; create a new schedule with a later end_time"
    ), resumed.stderr


async def test_a_pause_ending_past_the_window_and_a_rollout_cancelled_at_it_say_why(
    grpc_server: str, services: Services
) -> None:
    """`schedule pause --until` past the end_time is refused saying why; a rollout still waiting at the end
    is cancelled by rackflow, and `run show` says so and why."""
    assert isinstance(services.clock, FakeClock)
    racks = [await services.inventory.create_rack(name) for name in ("r1", "r2")]
    schedule = await services.schedules.create(
        name="fw",
        spec=ScheduleSpec(SpecType.INTERVAL, "1h"),
        overlap_policy=OverlapPolicy.SKIP,
        operation=Operation(
            OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=START + timedelta(minutes=90)
        ),
        queue=QueueOptions(),
        description="",
        target=TargetSpec(racks=tuple(RackTarget(id=rack.id) for rack in racks)),
        rollout=RolloutPolicy(max_concurrent_racks=1),
    )

    paused = await rackflow(
        grpc_server, "schedule", "pause", "fw", "--until", "2026-03-02T14:00:00Z", "--reason", "x"
    )
    assert paused.exit_code == 1, paused.output
    assert words(paused.stderr).startswith(
        "error: FAILED_PRECONDITION: resume_at: its firmware window's end at 2026-03-02T13:30:00Z (its "
        "upgrade's end_time) is not after 2026-03-02T14:00:00Z, so every firing's upgrade would be too late "
        "to start and be skipped; give an earlier resume_at, or none"
    ), paused.stderr

    triggered = await rackflow(grpc_server, "schedule", "trigger", "fw")
    assert triggered.exit_code == 0, triggered.output
    runs, _ = await services.schedules.list_runs(schedule.id)
    services.clock.advance(timedelta(hours=2))
    await services.rollouts.advance()

    shown = await rackflow(grpc_server, "run", "show", str(runs[0].id))
    assert shown.exit_code == 0, shown.output
    assert "cancelled" in shown.stdout
    assert (
        f"rollout cancelled by rackflow: {ENDED}: no wave starts at or after it, as each of its tasks would "
        "fail unrun, and no resume could move the end; create a new schedule with a later end_time for its "
        "racks not started; cancelled with 2 scope(s) not started, 1 of them by ending a task that had not "
        "begun"
    ) in words(shown.stdout), shown.stdout
