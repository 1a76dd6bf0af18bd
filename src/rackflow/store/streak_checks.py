"""Which schedules' failing streaks (`pause_after_failed_runs`, docs/SAFETY.md) must be looked at again.

A streak is decided by the schedule's newest counted runs (their states and outcomes), by the final
statuses of those runs' tasks, and by the schedule's own `enabled`, `pause_after_failed_runs` and
`failures_counted_until`. Every store write that can change one of those marks the schedule in
`failing_streak_checks`, in the writer's transaction: a task of a run ending (`tasks.set_status`,
`task_runs.finish`), a run recorded or changing state (`schedules.insert_runs`, `complete_runs`,
`decide_approval`, `rollouts.save_run`, `dispatch.mark_abandoned_runs`), the schedule saved
(`schedules.save_schedule`). Only enabled schedules that pause after failures are marked.

`ScheduleService.pause_failing` takes the marks and looks only at those schedules, so a poll in which
nothing changed reads one empty index and nothing else (issue 27: reading every such schedule, its runs and
their tasks on every poll took 0.9 s at 1,000 schedules and 17 s at 10,000 on PostgreSQL,
docs/PERFORMANCE.md).

A mark is an INSERT … ON CONFLICT DO NOTHING: once a schedule is marked, the other tasks of the same run
ending add nothing (a run of 10,000 racks writes one row, not 10,000). Taking the marks deletes them in a
transaction of its own, committed before the look reads anything: a change committed after that look
began marks the schedule again, and one committed before it is seen by it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import Select, delete, exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import Database, chunked, in_id_order
from rackflow.store.dialect import by_keys, insert_new
from rackflow.store.tables import failing_streak_checks, task_schedule, task_schedule_run, tasks

# Built once, so `dialect.by_keys` reuses what it builds from them (each firing batch marks twice).
_SCHEDULE_IDS = select(task_schedule.c.id)
_SCHEDULES_OF_RUNS = select(task_schedule_run.c.schedule_id)


async def mark_schedules(conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules (those enabled and pausing after failures) to be looked at again."""
    for chunk in chunked(in_id_order(schedule_ids)):
        await _mark(conn, by_keys(conn.dialect.name, _SCHEDULE_IDS, task_schedule.c.id, chunk))


async def mark_schedules_of_runs(conn: AsyncConnection, run_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules of these runs."""
    for chunk in chunked(in_id_order(run_ids)):
        await _mark(conn, by_keys(conn.dialect.name, _SCHEDULES_OF_RUNS, task_schedule_run.c.id, chunk))


async def mark_schedules_of_tasks(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules of these tasks that a run submitted (only those count towards a streak)."""
    task = tasks.c
    for chunk in chunked(in_id_order(task_ids)):
        await _mark(conn, select(task.schedule_id).where(task.id.in_(chunk), task.run_id.is_not(None)))


async def _mark(conn: AsyncConnection, schedule_ids: Select[tuple[uuid.UUID]]) -> None:
    """Mark the enabled schedules among `schedule_ids` that pause after failures, in id order (two
    writers marking the same schedules wait for each other in one order, never in a cycle)."""
    owner = task_schedule.c
    pausing = (
        select(owner.id)
        .where(
            owner.id.in_(schedule_ids),
            owner.pause_after_failed_runs > 0,
            owner.enabled.is_(True),
        )
        .order_by(owner.id)
    )
    stmt = insert_new(conn.dialect.name, failing_streak_checks).from_select(["schedule_id"], pausing)
    await conn.execute(stmt)


async def any_marked(conn: AsyncConnection) -> bool:
    """Whether any schedule is marked: the whole of an idle poll's look (one primary-key index probe)."""
    return bool((await conn.execute(select(exists().select_from(failing_streak_checks)))).scalar())


async def mark_every_schedule(conn: AsyncConnection) -> None:
    """Mark every enabled schedule that pauses after failures (the look at everything: the bound on a lost
    mark), to be looked at over the next polls, a batch at a time."""
    await _mark(conn, select(task_schedule.c.id))


async def take_marked(db: Database, conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    """Remove and return up to `limit` marked schedules, in id order (those another instance is taking
    meanwhile are left to it: SKIP LOCKED on PostgreSQL). The caller commits before it reads what
    decides their streaks."""
    marked = db.skip_locked(
        select(failing_streak_checks.c.schedule_id).order_by(failing_streak_checks.c.schedule_id).limit(limit)
    )
    stmt = (
        delete(failing_streak_checks)
        .where(failing_streak_checks.c.schedule_id.in_(marked.scalar_subquery()))
        .returning(failing_streak_checks.c.schedule_id)
    )
    return list((await conn.execute(stmt)).scalars())
