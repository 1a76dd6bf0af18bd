"""The reads behind the dashboard, on both databases: recent runs per schedule, counts by state and status,
recent failures, the schedules that fire soonest, and schedule lists sorted with missing times last."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import update

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, ScheduleOrder
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.errors import FailedPrecondition
from rackflow.store import paging
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.timespec import ScheduleSpec, SpecType
from tests.store.schedules_support import START, make_env, rack_target


async def test_recent_runs_are_each_schedules_newest_first(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    busy = await env.schedule("busy", racks=[rack])
    quiet = await env.schedule("quiet", racks=[rack])
    never = await env.schedule("never", racks=[rack])
    for _ in range(5):
        env.clock.advance(timedelta(minutes=1))
        # After the first, the rack is busy: every scope fails and the trigger says so, but it fired.
        with contextlib.suppress(FailedPrecondition):
            await env.services.schedules.trigger(busy.id)
    with contextlib.suppress(FailedPrecondition):  # r1 is still busy with busy's task
        await env.services.schedules.trigger(quiet.id)

    found = await env.services.schedules.recent_runs([busy.id, quiet.id, never.id], per_schedule=3)
    assert [len(found[s.id]) for s in (busy, quiet, never)] == [3, 1, 0]
    fired = [run.fired_at for run in found[busy.id]]
    assert fired == sorted(fired, reverse=True) and fired[0] == env.clock.now()
    all_runs, _ = await env.services.schedules.list_runs(busy.id)
    assert [r.id for r in found[busy.id]] == [r.id for r in all_runs[:3]]


async def test_state_counts_and_the_soonest_to_fire(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    later = await env.schedule("later", racks=[rack], spec=ScheduleSpec(SpecType.INTERVAL, "3h"))
    soon = await env.schedule("soon", racks=[rack], spec=ScheduleSpec(SpecType.INTERVAL, "1h"))
    paused = await env.schedule("paused", racks=[rack], spec=ScheduleSpec(SpecType.INTERVAL, "30m"))
    await env.services.schedules.pause(paused.id)
    once = await env.schedule(
        "once", racks=[rack], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-03-02T12:30:00Z")
    )
    await env.services.schedules.trigger(once.id)  # consumed

    counts = await env.services.schedules.state_counts()
    assert (counts.enabled, counts.paused, counts.finished) == (2, 1, 1)
    assert [s.id for s in await env.services.schedules.next_to_fire(5)] == [soon.id, later.id]
    assert await env.services.schedules.due_count() == 0
    env.clock.advance(timedelta(hours=3))  # the clock that decides what is due: the test's
    assert await env.services.schedules.due_count() == 2


async def test_lists_sort_missing_next_runs_last_either_way(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    once = await env.schedule(
        "a-once", racks=[rack], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-03-02T12:30:00Z")
    )
    await env.services.schedules.trigger(once.id)  # no next run any more
    env.clock.advance(timedelta(seconds=1))  # ties (two without a last run) go by creation time
    await env.schedule("b-hourly", racks=[rack], spec=ScheduleSpec(SpecType.INTERVAL, "1h"))
    env.clock.advance(timedelta(seconds=1))
    await env.schedule("c-daily", racks=[rack], spec=ScheduleSpec(SpecType.INTERVAL, "24h"))

    async def names(order: ScheduleOrder) -> list[str]:
        return [s.name for s in (await env.services.schedules.list_schedules(order=order))[0]]

    assert await names(ScheduleOrder("next_run_at")) == ["b-hourly", "c-daily", "a-once"]
    assert await names(ScheduleOrder("next_run_at", descending=True)) == ["c-daily", "b-hourly", "a-once"]
    assert await names(ScheduleOrder("last_run_at")) == ["a-once", "b-hourly", "c-daily"]
    assert await names(ScheduleOrder("name", descending=True)) == ["c-daily", "b-hourly", "a-once"]


async def test_task_counts_statuses_and_recent_failures(db: Database) -> None:
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await env.schedule("reset", racks=racks)
    old_failed, old_running, _ = await env.services.schedules.trigger(schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, [old_failed], TaskStatus.FAILED, now=env.clock.now())
        await task_store.set_status(conn, [old_running], TaskStatus.RUNNING, now=env.clock.now())
    env.clock.advance(timedelta(days=2))
    new_failed, *_ = await env.services.schedules.trigger(schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, [new_failed], TaskStatus.FAILED, now=env.clock.now())

    since = env.clock.now() - timedelta(hours=24)
    counts = await env.services.tasks.status_counts(since)
    # Active tasks of any age; ended ones only when created since: the old failure is not counted. (The
    # second firing submitted only on r0: the old running and pending tasks hold r1 and r2.)
    assert counts == {TaskStatus.FAILED: 1, TaskStatus.RUNNING: 1, TaskStatus.PENDING: 1}
    assert [t.id for t in await env.services.tasks.failed_since(since, 10)] == [new_failed]
    assert [t.id for t in await env.services.tasks.failed_since(START, 10)] == [new_failed, old_failed]
    statuses = await env.services.tasks.statuses([old_failed, old_running, schedule.id])
    assert statuses == {old_failed: TaskStatus.FAILED, old_running: TaskStatus.RUNNING}


async def test_task_counts_stop_past_the_cap(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each status is counted up to LIST_COUNT_CAP + 1 (a busy day's ended tasks are not read one by one):
    a count past the cap means "more than the cap"; one at or under it is exact."""
    monkeypatch.setattr(paging, "LIST_COUNT_CAP", 2)
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(5)]
    schedule = await env.schedule("reset", racks=racks)
    fired = await env.services.schedules.trigger(schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, fired[:4], TaskStatus.FAILED, now=env.clock.now())
        await task_store.set_status(conn, fired[4:], TaskStatus.COMPLETED, now=env.clock.now())
    env.clock.advance(timedelta(hours=1))
    await env.services.schedules.trigger(schedule.id)  # five pending tasks, the racks free again

    counts = await env.services.tasks.status_counts(env.clock.now() - timedelta(hours=24))
    assert counts == {TaskStatus.FAILED: 3, TaskStatus.COMPLETED: 1, TaskStatus.PENDING: 3}


async def test_names_by_id_and_ids_by_name(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    schedule = await env.schedule("nightly", racks=[rack])
    assert await env.services.schedules.id_by_name("nightly") == schedule.id
    assert await env.services.schedules.names([schedule.id, rack.id]) == {schedule.id: "nightly"}
    assert await env.services.inventory.rack_id_by_name("r1") == rack.id
    assert await env.services.inventory.rack_names([rack.id, schedule.id]) == {rack.id: "r1"}


async def test_held_tasks_are_the_pending_ones_held_back_or_deferred(db: Database) -> None:
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(4)]
    schedule = await env.schedule("reset", racks=racks)
    frozen, deferred, free, running = await env.services.schedules.trigger(schedule.id)
    later = env.clock.now() + timedelta(hours=2)
    async with db.transaction() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == frozen).values(not_before=later))
        (task,) = await task_store.get_tasks(conn, [deferred])
        opening = replace(task.operation, window_start=later, window_end=later + timedelta(hours=1))
        await conn.execute(update(tasks).where(tasks.c.id == deferred).values(parameters=opening.to_json()))
        await conn.execute(update(tasks).where(tasks.c.id == running).values(not_before=later))
        await task_store.set_status(conn, [running], TaskStatus.RUNNING, now=env.clock.now())

    held, total = await env.services.tasks.held(10)
    assert {t.id for t in held} == {frozen, deferred} and total == 2
    assert free not in {t.id for t in held}
    assert len((await env.services.tasks.held(1))[0]) == 1
    env.clock.advance(timedelta(hours=3))  # the freeze and the deferral are over
    assert await env.services.tasks.held(10) == ([], 0)


async def test_halted_rollouts_newest_first_and_live_states(db: Database) -> None:
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(2)]
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    made = []
    for name in ("a", "b", "c"):
        made.append(
            await env.services.schedules.create(
                name=name,
                spec=ScheduleSpec(SpecType.INTERVAL, "1h"),
                overlap_policy=OverlapPolicy.SKIP,
                operation=Operation(OperationKind.POWER_OFF),
                queue=QueueOptions(),
                description="",
                target=rack_target(*racks),
                rollout=policy,
            )
        )
    for schedule in made[:2]:  # one rack at a time: the first fails and the rollout halts
        env.clock.advance(timedelta(minutes=1))
        (task_id,) = await env.services.schedules.trigger(schedule.id)
        async with db.transaction() as conn:
            await task_store.set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())
        await env.services.rollouts.advance()
    env.clock.advance(timedelta(minutes=1))
    await env.services.schedules.trigger(made[2].id)  # rolling

    halted = await env.services.rollouts.halted(10)
    assert [r.schedule_id for r in halted] == [made[1].id, made[0].id]
    assert [r.state for r in halted] == ["halted", "halted"]
    assert [r.schedule_id for r in await env.services.rollouts.halted(1)] == [made[1].id]
    live = await env.services.rollouts.live([s.id for s in made])
    assert live == {made[0].id: "halted", made[1].id: "halted", made[2].id: "rolling"}
