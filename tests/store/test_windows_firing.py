"""Firing obeys maintenance windows, on both databases: SKIP records "skipped_window" naming the window,
DEFER submits a task that waits for the rack's next opening (and fails, past the opening's end or the start
deadline that capped it, naming which), and a manual trigger ignores ALLOW windows."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rackflow.clock import FakeClock
from rackflow.domain.firing import RunResult
from rackflow.domain.inventory import Rack
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import Operation, OperationKind, Task, TaskStatus
from rackflow.domain.windows import OneOff, Recurring, WindowKind, WindowPolicy
from rackflow.schedules import firing
from rackflow.services import Services
from rackflow.store import dispatch, task_runs
from rackflow.store.db import Database
from rackflow.tasks.backends.simulator import SimulatorBackend
from rackflow.tasks.executor import Executor
from rackflow.timespec import ScheduleSpec, SpecType, format_rfc3339
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import START, Env, make_env
from tests.store.test_executor import FAST, finished

NIGHTLY = Recurring("0 2 * * *", "2h")  # 02:00-04:00 UTC
TOMORROW_2AM = datetime(2026, 3, 3, 2, 0, tzinfo=UTC)


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def window(env: Env, name: str, kind: WindowKind, when: Recurring | OneOff, *racks: Rack) -> None:
    await env.services.windows.create(
        WindowInput(name=name, kind=kind, when=when, racks=tuple(Ref(r.id) for r in racks))
    )


async def with_policy(env: Env, schedule: Schedule, policy: WindowPolicy) -> Schedule:
    return await env.services.schedules.update(schedule.id, ["schedule.window_policy"], window_policy=policy)


async def dispatch_at(
    env: Env, now: datetime, default_start_deadline: timedelta | None = None
) -> list[RunResult]:
    """What the dispatcher does on one poll, with `now` as its clock (it reads the database's), under the
    server's start deadline."""
    async with env.db.transaction() as conn:
        due = await dispatch.claim_due(env.db, conn, now, batch=100)
        claimed = await firing.claim(
            env.db,
            conn,
            due,
            trigger="dispatch",
            now=now,
            owner_id=uuid.uuid4(),
            default_start_deadline=default_start_deadline,
        )
    return await firing.fire(env.db, env.services.tasks, env.clock, claimed)


async def test_skip_records_skipped_window_naming_the_window_and_fires_the_rest(env: Env) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    await window(env, "launch", WindowKind.FREEZE, OneOff(START, START + timedelta(days=1)), r2)
    schedule = await env.schedule(racks=[r1, r2, r3])
    assert schedule.window_policy is WindowPolicy.SKIP  # the default

    (result,) = await dispatch_at(env, START + timedelta(hours=1))

    outcomes = {o.rack_id: o for o in result.outcomes}
    assert outcomes[r1.id].outcome == "skipped_window"
    assert "outside allow window 'nightly' (opens at 2026-03-03T02:00:00Z)" in outcomes[r1.id].error
    assert outcomes[r2.id].outcome == "skipped_window"
    assert "inside freeze 'launch' until 2026-03-03T12:00:00Z" in outcomes[r2.id].error
    assert (outcomes[r3.id].outcome, outcomes[r3.id].error) == ("submitted", "")
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert [o.outcome for o in sorted(run.outcomes, key=lambda o: o.rack_id == r3.id)] == [
        "skipped_window",
        "skipped_window",
        "submitted",
    ]


async def test_inside_the_allow_window_it_fires(env: Env) -> None:
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    await env.schedule(racks=[r1])
    (result,) = await dispatch_at(env, TOMORROW_2AM + timedelta(minutes=30))
    assert [o.outcome for o in result.outcomes] == ["submitted"]


async def test_a_window_for_other_operations_does_not_apply(env: Env) -> None:
    r1 = await env.rack("r1")
    await env.services.windows.create(
        WindowInput(
            name="fw", kind=WindowKind.FREEZE, when=OneOff(START, START + timedelta(days=1)),
            operations=(OperationKind.UPGRADE_FIRMWARE,),
        )
    )  # fmt: skip
    await env.schedule(racks=[r1])  # power off
    (result,) = await dispatch_at(env, START + timedelta(hours=1))
    assert [o.outcome for o in result.outcomes] == ["submitted"]


async def test_defer_submits_a_task_that_waits_for_the_next_opening(env: Env) -> None:
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    fired_at = START + timedelta(hours=1)

    (result,) = await dispatch_at(env, fired_at)

    (outcome,) = result.outcomes
    assert outcome.outcome == "submitted" and outcome.task_id is not None
    (task,) = await env.services.tasks.get_tasks([outcome.task_id])
    assert task.status is TaskStatus.PENDING
    assert (task.not_before, task.not_after) == (TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2))
    assert task.operation == Operation(OperationKind.POWER_OFF)  # the opening is a hold, not a parameter
    assert task.held_by == "window" and task.held_reason == task.message
    assert "waits for the opening at 2026-03-03T02:00:00Z" in task.message
    assert "'nightly'" in task.message

    async def claimable(at: datetime) -> list[uuid.UUID]:
        async with env.db.transaction() as conn:
            claimed = await task_runs.claim(
                env.db, conn, owner_id=uuid.uuid4(), lease_ttl=timedelta(seconds=15), running_here=(),
                now=at, limit=10,
            )  # fmt: skip
            await conn.rollback()
        return [t.id for t, _ in claimed]

    assert await claimable(fired_at + timedelta(hours=1)) == []  # the executor leaves it until 02:00
    assert await claimable(TOMORROW_2AM) == [task.id]
    assert schedule.window_policy is WindowPolicy.DEFER


async def test_defer_of_a_firmware_upgrade_keeps_inside_its_own_window(env: Env) -> None:
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    own = Operation(
        OperationKind.UPGRADE_FIRMWARE,
        target_version="2.0",
        window_start=TOMORROW_2AM + timedelta(hours=1),
        window_end=TOMORROW_2AM + timedelta(days=5),
    )
    schedule = await env.schedule(racks=[r1], operation=own)
    await with_policy(env, schedule, WindowPolicy.DEFER)
    (result,) = await dispatch_at(env, START + timedelta(hours=1))
    (task,) = await env.services.tasks.get_tasks([result.outcomes[0].task_id])  # type: ignore[list-item]
    assert (task.not_before, task.not_after) == (
        TOMORROW_2AM + timedelta(hours=1),
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert task.operation == own  # its own window stays its parameter


async def test_manual_trigger_ignores_allow_windows(env: Env) -> None:
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    schedule = await env.schedule(racks=[r1])
    assert len(await env.services.schedules.trigger(schedule.id)) == 1


async def test_window_policy_is_stored_and_updated(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    deferred = await with_policy(env, schedule, WindowPolicy.DEFER)
    assert (await env.services.schedules.get(schedule.id)).window_policy is WindowPolicy.DEFER
    assert deferred.window_policy is WindowPolicy.DEFER


@pytest.mark.parametrize("policy", list(WindowPolicy))
async def test_the_preview_predicts_every_outcome_the_dispatcher_then_records(
    env: Env, policy: WindowPolicy
) -> None:
    """Fire the previewed times with a controlled clock: outcome by outcome, the dispatcher does what the
    preview said (both run the planner, `domain.firing.plan`)."""
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    freeze = OneOff(START + timedelta(hours=3, minutes=30), START + timedelta(hours=7))
    await window(env, "launch", WindowKind.FREEZE, freeze, r2, r1)
    # r3 may be touched only once, from 2h to 5h: later firings have no opening left to defer to.
    await window(
        env, "once", WindowKind.ALLOW, OneOff(START + timedelta(hours=2), START + timedelta(hours=5)), r3
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1, r2, r3]), policy)

    planned = await env.services.schedules.preview_schedule(schedule.id, None, 30)

    assert [p.at for p in planned] == [START + timedelta(hours=h) for h in range(1, 31)]
    seen = {s.decision.action for p in planned for s in p.scopes if s.decision is not None}
    assert seen == (
        {"fire", "skip_window", "defer"} if policy is WindowPolicy.DEFER else {"fire", "skip_window"}
    )
    for firing_plan in planned:
        (result,) = await dispatch_at(env, firing_plan.at)
        outcomes = {o.scope_id: o for o in result.outcomes}
        for scope_plan in firing_plan.scopes:
            decision, outcome = scope_plan.decision, outcomes[scope_plan.scope.id]
            assert decision is not None
            expected = {"fire": "submitted", "defer": "submitted", "skip_window": "skipped_window"}
            assert outcome.outcome == expected[decision.action], (firing_plan.at, scope_plan.rack_name)
            if decision.action == "skip_window":
                assert outcome.error == decision.reason
                continue
            assert outcome.task_id is not None
            (task,) = await env.services.tasks.get_tasks([outcome.task_id])
            assert (task.not_before, task.not_after) == (decision.opens_at, decision.closes_at)
            await env.services.tasks.cancel(task.id)  # so the next firing's overlap check passes
        after = await env.services.schedules.get(schedule.id)
        assert after.last_run_at == firing_plan.at


async def test_the_preview_of_a_paused_schedule_says_paused(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 3 * * *"))
    await env.services.schedules.pause(schedule.id)
    planned = await env.services.schedules.preview_schedule(schedule.id, START + timedelta(days=2), 2)
    assert [p.at for p in planned] == [
        datetime(2026, 3, 5, 3, tzinfo=UTC),
        datetime(2026, 3, 6, 3, tzinfo=UTC),
    ]
    assert [s.decision for p in planned for s in p.scopes] == [None, None]


async def test_the_preview_of_a_pause_with_an_end_resumes_then(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 3 * * *"))
    resume_at = datetime(2026, 3, 4, 12, tzinfo=UTC)
    await env.services.schedules.pause(schedule.id, reason="PSU swap", resume_at=resume_at)
    planned = await env.services.schedules.preview_schedule(schedule.id, None, 4)
    assert [
        (p.at.day, p.resume_at, [s.decision.action if s.decision else "paused" for s in p.scopes])
        for p in planned
    ] == [
        (3, resume_at, ["paused"]),
        (4, resume_at, ["paused"]),
        (5, None, ["fire"]),
        (6, None, ["fire"]),
    ]


# The slot is on time; the rack's window opens at 02:00 until 04:00. A start deadline ending at 03:00 caps
# the deferred task's end there; without one the window's end does. Past that end the executor fails the
# task, naming what ended it.
@pytest.mark.parametrize(
    ("deadline_at", "failed_at", "words"),
    [
        (
            TOMORROW_2AM + timedelta(hours=1),
            TOMORROW_2AM + timedelta(minutes=90),
            "its firing's start deadline",
        ),
        (None, TOMORROW_2AM + timedelta(hours=3), "the maintenance window"),
    ],
)
async def test_a_deferred_task_not_started_in_time_fails_naming_the_window_or_the_start_deadline(
    env: Env, deadline_at: datetime | None, failed_at: datetime, words: str
) -> None:
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    assert schedule.next_run_at is not None
    if deadline_at is not None:
        deadline = deadline_at - schedule.next_run_at
        await env.services.schedules.update(schedule.id, ["schedule.start_deadline"], start_deadline=deadline)

    (result,) = await dispatch_at(env, schedule.next_run_at)

    (outcome,) = result.outcomes
    assert outcome.outcome == "submitted" and outcome.task_id is not None
    assert outcome.start_by == deadline_at
    (task,) = await env.services.tasks.get_tasks([outcome.task_id])
    assert task.not_after == (deadline_at or TOMORROW_2AM + timedelta(hours=2))
    assert ("its start deadline" in task.message) is (deadline_at is not None)

    env.clock.advance(failed_at - env.clock.now())
    task = await run_until_finished(env, task)
    assert task.status is TaskStatus.FAILED
    assert task.not_after is not None
    # The task never ran: "the task", not "attempt 1", could not (the claim that found it too late had
    # stamped its start).
    ended = "passed" if deadline_at else "ended"
    assert task.message == f"{words} {ended} at {format_rfc3339(task.not_after)} before the task could run"


async def run_until_finished(env: Env, task: Task, default_start_deadline: timedelta | None = None) -> Task:
    """Run an executor, with the services' start gates (and the server's start deadline), until `task` has
    finished."""
    executor = Executor(
        env.db,
        env.clock,
        SimulatorBackend(FAST),
        poll_interval=0.05,
        lease_ttl=1.0,
        instance_id=uuid.uuid4(),
        gates=env.services.gates,
        default_start_deadline=default_start_deadline,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        return await finished(env.db, task)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


async def test_a_task_fired_inside_an_allow_window_does_not_start_after_it_closed(env: Env) -> None:
    """Fired inside its rack's ALLOW window, a task that then waits (a full budget, a pre-flight check, the
    rack's queue) until the window has closed fails rather than starts outside it, as a deferred one does."""
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    await env.schedule(racks=[r1])

    (result,) = await dispatch_at(env, TOMORROW_2AM + timedelta(minutes=30))

    (outcome,) = result.outcomes
    assert outcome.outcome == "submitted" and outcome.task_id is not None
    (task,) = await env.services.tasks.get_tasks([outcome.task_id])
    assert (task.status, task.not_before, task.held_by) == (TaskStatus.PENDING, None, None)
    assert task.not_after == TOMORROW_2AM + timedelta(hours=2)

    env.clock.advance(TOMORROW_2AM + timedelta(hours=2) - env.clock.now())  # it waited until the close
    task = await run_until_finished(env, task)
    assert task.status is TaskStatus.FAILED
    assert task.message == ("the maintenance window ended at 2026-03-03T04:00:00Z before the task could run")


async def test_a_task_past_its_windows_end_fails_at_once_rather_than_wait_out_a_freeze(env: Env) -> None:
    """A deferred task whose opening a freeze cut short, claimed inside that freeze after the opening's end,
    can never start: it fails at that claim, naming the window, instead of being held (and shown as waiting)
    until the freeze ends days later, or taking a budget's room or a pre-flight check's round meanwhile."""
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    freeze_from = TOMORROW_2AM + timedelta(hours=1)
    await window(env, "launch", WindowKind.FREEZE, OneOff(freeze_from, freeze_from + timedelta(days=2)), r1)
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    assert schedule.next_run_at is not None

    (result,) = await dispatch_at(env, schedule.next_run_at)

    (task,) = await env.services.tasks.get_tasks([result.outcomes[0].task_id])  # type: ignore[list-item]
    assert (task.not_before, task.not_after) == (TOMORROW_2AM, freeze_from)  # the freeze ends the opening
    env.clock.advance(freeze_from + timedelta(minutes=30) - env.clock.now())
    task = await run_until_finished(env, task)
    assert (task.status, task.held_by) == (TaskStatus.FAILED, None)
    assert task.message == ("the maintenance window ended at 2026-03-03T03:00:00Z before the task could run")


@pytest.mark.parametrize("whose", ["the schedule's", "the server's"])
async def test_a_task_found_too_late_before_its_write_back_names_its_start_deadline(
    db: Database, monkeypatch: pytest.MonkeyPatch, whose: str
) -> None:
    """Deferred to 02:00-04:00 under a deadline of 14 h from its slot (03:00, which capped its end), the
    task is found at 03:30 by an executor before its firing's write-back recorded the deadline on its
    outcome: it fails naming the deadline (from the run's slot and the schedule's, or the server's,
    deadline), not the window."""
    deadline = timedelta(hours=14)
    server_s = deadline if whose == "the server's" else None
    clock = FakeClock(START)
    env = Env(db, clock, Services.build(db, clock, default_start_deadline=server_s))
    r1 = await env.rack("r1")
    await window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    if server_s is None:
        await env.services.schedules.update(schedule.id, ["schedule.start_deadline"], start_deadline=deadline)
    assert schedule.next_run_at is not None
    capped = schedule.next_run_at + deadline
    assert capped == TOMORROW_2AM + timedelta(hours=1)
    write_back = firing._write_back
    ended: list[Task] = []

    async def found_too_late_first(*args: Any, **kwargs: Any) -> Any:
        results = args[2]
        (task,) = await env.services.tasks.get_tasks([results[0].outcomes[0].task_id])
        assert task.not_after == capped
        env.clock.advance(capped + timedelta(minutes=30) - env.clock.now())
        ended.append(await run_until_finished(env, task, server_s))
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", found_too_late_first)
    await dispatch_at(env, schedule.next_run_at, server_s)

    (task,) = ended
    assert task.status is TaskStatus.FAILED
    assert task.message == (
        f"its firing's start deadline passed at {format_rfc3339(capped)} before the task could run"
    )
