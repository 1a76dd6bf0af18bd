"""A dispatched rollout's racks obey the maintenance windows when their turn comes, on both databases: a
rack closed under the SKIP window policy is "skipped_window" (neither success nor failure, the rollout goes
on), under DEFER its task waits for the rack's next opening. The windows here are created after the firing,
so only the rollout's later starts can have seen them, but for the start deadline's: its first wave's
deferrals are capped at the deadline, as a plain firing's are, and the later waves' are not."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from rackflow.domain.inventory import Rack
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import QueueOptions, Task, TaskStatus
from rackflow.domain.windows import OneOff, Recurring, WindowKind, WindowPolicy
from rackflow.schedules import firing
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.timespec import format_rfc3339
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import HOURLY, POWER_OFF, START, Env, make_env, rack_target

TOMORROW_2AM = datetime(2026, 3, 3, 2, 0, tzinfo=UTC)  # START is 2026-03-02 12:00 UTC
ONE_AT_A_TIME = RolloutPolicy(max_concurrent_racks=1)


async def _rollout(
    env: Env,
    racks: Sequence[Rack],
    policy: WindowPolicy,
    start_deadline_at: datetime | None = None,
    rollout: RolloutPolicy = ONE_AT_A_TIME,
) -> Schedule:
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        window_policy=policy,
        rollout=rollout,
    )
    if start_deadline_at is not None:  # its slot + its start deadline
        assert schedule.next_run_at is not None
        deadline = start_deadline_at - schedule.next_run_at
        path = ["schedule.start_deadline"]
        schedule = await env.services.schedules.update(schedule.id, path, start_deadline=deadline)
    async with env.db.transaction() as conn:  # the dispatcher's firing, at the services' clock
        claimed = await firing.claim(
            env.db, conn, [schedule], trigger="dispatch", now=env.clock.now(), owner_id=uuid.uuid4()
        )
    await firing.fire(env.db, env.services.tasks, env.clock, claimed)
    await env.services.rollouts.advance()  # its first step, as the dispatcher takes after a firing
    return schedule


async def _tasks(env: Env, schedule: Schedule) -> list[Task]:
    found, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    return found


async def _finish_active(env: Env, schedule: Schedule) -> None:
    active = [t.id for t in await _tasks(env, schedule) if t.status.is_active]
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, active, TaskStatus.COMPLETED, now=env.clock.now())
    await env.services.rollouts.advance()


async def _window(env: Env, name: str, kind: WindowKind, when: OneOff | Recurring, rack: Rack) -> None:
    await env.services.windows.create(WindowInput(name=name, kind=kind, when=when, racks=(Ref(rack.id),)))


async def test_a_rack_frozen_at_its_turn_is_skipped_and_the_rollout_goes_on(db: Database) -> None:
    env = make_env(db)
    r0, r1, r2 = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _rollout(env, [r0, r1, r2], WindowPolicy.SKIP)
    assert [t.rack_id for t in await _tasks(env, schedule)] == [r0.id]
    await _window(env, "launch", WindowKind.FREEZE, OneOff(START, START + timedelta(days=1)), r1)

    await _finish_active(env, schedule)  # r0 done: r1's turn, inside the freeze
    await env.services.rollouts.advance()  # the next step gives r1's place to r2

    runs, _ = await env.services.schedules.list_runs(schedule.id)
    report = await env.services.rollouts.get(runs[0].id)
    by_rack = {o.rack_id: o for o in report.run.outcomes}
    assert by_rack[r1.id].outcome == "skipped_window" and "freeze 'launch'" in by_rack[r1.id].error
    assert by_rack[r2.id].outcome == "submitted"
    await _finish_active(env, schedule)
    report = await env.services.rollouts.get(runs[0].id)
    assert report.run.state == "completed"
    assert report.progress is not None
    assert (report.progress.succeeded, report.progress.skipped, report.progress.failed) == (2, 1, 0)
    assert sorted(t.rack_id for t in await _tasks(env, schedule)) == sorted([r0.id, r2.id])


async def test_a_rack_closed_at_its_turn_waits_for_its_opening_under_defer(db: Database) -> None:
    env = make_env(db)
    r0, r1 = await env.rack("r0"), await env.rack("r1")
    schedule = await _rollout(env, [r0, r1], WindowPolicy.DEFER)
    await _window(env, "nightly", WindowKind.ALLOW, Recurring("0 2 * * *", "2h"), r1)

    await _finish_active(env, schedule)

    (waiting,) = [t for t in await _tasks(env, schedule) if t.rack_id == r1.id]
    assert waiting.status is TaskStatus.PENDING
    assert (waiting.not_before, waiting.not_after) == (
        TOMORROW_2AM,
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert "waits for the opening at 2026-03-03T02:00:00Z" in waiting.message


async def test_a_first_wave_rack_deferred_to_its_window_starts_by_the_start_deadline(db: Database) -> None:
    """r0 (the first wave: one rack at a time) and r1 open at 02:00 until 04:00, and the firing's start
    deadline is 03:00. r0's task, submitted as the rollout fires, must start by 03:00 (past it, it fails
    naming the deadline: its outcome keeps `start_by`); r1's turn comes once r0 ended, a later wave, which
    the deadline does not bound."""
    env = make_env(db)
    r0, r1 = await env.rack("r0"), await env.rack("r1")
    await env.services.windows.create(
        WindowInput(
            name="nightly",
            kind=WindowKind.ALLOW,
            when=Recurring("0 2 * * *", "2h"),
            racks=(Ref(r0.id), Ref(r1.id)),
        )
    )
    deadline_at = TOMORROW_2AM + timedelta(hours=1)
    schedule = await _rollout(env, [r0, r1], WindowPolicy.DEFER, start_deadline_at=deadline_at)

    (first,) = await _tasks(env, schedule)
    assert first.rack_id == r0.id and first.status is TaskStatus.PENDING
    assert (first.not_before, first.not_after) == (TOMORROW_2AM, deadline_at)
    assert first.message.endswith(f"until {format_rfc3339(deadline_at)}, its start deadline"), first.message
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    by_rack = {o.rack_id: o for o in (await env.services.rollouts.get(runs[0].id)).run.outcomes}
    assert (by_rack[r0.id].outcome, by_rack[r0.id].start_by) == ("submitted", deadline_at)

    await _finish_active(env, schedule)  # r0 done: r1's turn, a later wave
    (later,) = [t for t in await _tasks(env, schedule) if t.rack_id == r1.id]
    assert (later.not_before, later.not_after) == (TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2))
    by_rack = {o.rack_id: o for o in (await env.services.rollouts.get(runs[0].id)).run.outcomes}
    assert (by_rack[r1.id].outcome, by_rack[r1.id].start_by) == ("submitted", None)


async def test_a_rack_missed_for_the_start_deadline_is_no_failure(db: Database) -> None:
    """r0's window opens after the deadline: it is "missed", settled without a task as a closed window
    settles a rack, neither success nor failure, so it does not halt a rollout that halts on one failure."""
    env = make_env(db)
    r0, r1 = await env.rack("r0"), await env.rack("r1")
    await _window(env, "nightly", WindowKind.ALLOW, Recurring("0 2 * * *", "2h"), r0)
    halting = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    schedule = await _rollout(env, [r0, r1], WindowPolicy.DEFER, TOMORROW_2AM - timedelta(hours=1), halting)

    runs, _ = await env.services.schedules.list_runs(schedule.id)
    report = await env.services.rollouts.get(runs[0].id)
    assert report.run.state == "rolling", report.run.reason
    by_rack = {o.rack_id: o for o in report.run.outcomes}
    assert (by_rack[r0.id].outcome, by_rack[r1.id].outcome) == ("missed", "submitted")
    assert report.progress is not None
    assert (report.progress.failed, report.progress.skipped, report.progress.failures_counted) == (0, 1, 0)


async def test_a_deferred_rack_whose_window_no_longer_opens_is_skipped_and_the_rollout_goes_on(
    db: Database,
) -> None:
    """r1's task waits for its ALLOW window; the window is edited so that no opening is left: the task is
    ended and r1 is "skipped_window", as its turn would have found it, not a failure: a rollout that
    halts on one failure goes on to r2 (`rackflow.tasks.deferrals`)."""
    env = make_env(db)
    r0, r1, r2 = [await env.rack(f"r{i}") for i in range(3)]
    halting = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    schedule = await _rollout(env, [r0, r1, r2], WindowPolicy.DEFER, rollout=halting)
    await _window(env, "nightly", WindowKind.ALLOW, Recurring("0 2 * * *", "2h"), r1)
    await _finish_active(env, schedule)  # r0 done: r1's turn, deferred to 02:00
    (waiting,) = [t for t in await _tasks(env, schedule) if t.rack_id == r1.id]
    assert waiting.not_before == TOMORROW_2AM

    over = OneOff(START - timedelta(hours=3), START - timedelta(hours=2))
    window_id = await env.services.windows.id_by_name("nightly")
    await env.services.windows.update(window_id, ["window.when"], WindowInput(when=over))
    await env.services.rollouts.advance()

    (ended,) = [t for t in await _tasks(env, schedule) if t.rack_id == r1.id]
    assert ended.status is TaskStatus.TERMINATED
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    report = await env.services.rollouts.get(runs[0].id)
    by_rack = {o.rack_id: o for o in report.run.outcomes}
    assert by_rack[r1.id].outcome == "skipped_window"
    assert (report.run.state, by_rack[r2.id].outcome) == ("rolling", "submitted")
