"""Which schedules' failing streaks (`pause_after_failed_runs`, docs/SAFETY.md) must be looked at again.

A streak is decided by the schedule's newest counted runs (their states and outcomes), by the final
statuses of those runs' tasks, and by the schedule's own `enabled`, `pause_after_failed_runs` and
`failures_counted_until`. Every store write that can change one of those marks the schedule in
`failing_streak_checks`, in the writer's transaction: a task of a run ending (`tasks.set_status`,
`task_runs.finish`), a run recorded or changing state (`runs.insert_runs`, `complete_runs`,
`decide_awaiting`, `rollouts.save_run`, `dispatch.mark_abandoned_runs`), the schedule saved
(`schedules.save_schedule`). Only enabled schedules that pause after failures are marked.

`ScheduleService.pause_failing` takes the marks and looks only at those schedules, so a poll in which
nothing changed reads one empty index and nothing else (issue 27: reading every such schedule, its runs and
their tasks on every poll took 0.9 s at 1,000 schedules and 17 s at 10,000 on PostgreSQL,
docs/PERFORMANCE.md).

A mark is a row of its own (`failing_streak_checks.seq`, migration 0029): every writer inserts one per
schedule it marks, never looking at the marks already there, so a look can take only marks whose writers
have committed (an uncommitted row is invisible to it). Taking the marks deletes them in a transaction of
its own, committed before the look reads anything. Hence the guarantee: every change that can change a
streak is followed, after it commits, by a look at its schedule that reads it (on any instance). Its mark
is taken only after its writer committed, by a take that commits before its look reads, and those reads
see every change committed before they began. The one way to lose a mark is an instance stopping between
its take and its decision (a look that fails marks its schedules again): the full look bounds that.
(Until 0029 a schedule had one mark, inserted with ON CONFLICT DO NOTHING: a writer that found a mark
committed by another added nothing, and a look could take that mark and read before the writer
committed, so its change waited for the next full look, up to an hour.)

How many rows: one per marking statement and schedule. A writer transaction marks a schedule once or
twice (a firing batch: its runs recorded, then those finished at birth), plus once per chunk of 1,000
tasks or runs (`db.CHUNK_SIZE`) it ends: an executor's journal round ending 500 tasks of one run writes
one row, and a run of 10,000 racks a row per journal round that ends some of its tasks, not 10,000. A
look takes every committed row of the schedules it takes, so the table holds the marks made since the
last look and those of writers still open: a few rows per busy schedule. A full look adds a row only for
the schedules with none.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from sqlalchemy import Select, delete, exists, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import Database, chunked, in_id_order
from rackflow.store.dialect import by_keys
from rackflow.store.tables import failing_streak_checks, task_schedule, task_schedule_run, tasks
from rackflow.store.task_partitions import of_tasks

# Built once, so `dialect.by_keys` reuses what it builds from them (each firing batch marks twice).
_SCHEDULE_IDS = select(task_schedule.c.id)
_SCHEDULES_OF_RUNS = select(task_schedule_run.c.schedule_id)


async def mark_schedules(conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules (those enabled and pausing after failures) to be looked at again."""
    for chunk in chunked(in_id_order(schedule_ids)):
        await _mark(conn, by_keys(conn.dialect.name, _SCHEDULE_IDS, task_schedule.c.id, chunk))


async def mark_schedules_of_runs(conn: AsyncConnection, run_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules of these runs: SQLite's write-back (`runs.complete_runs`). On PostgreSQL
    the write-back's UPDATE returns them instead: a look-up of runs by id would plan every partition of
    the runs (`store.run_partitions`)."""
    for chunk in chunked(in_id_order(run_ids)):
        await _mark(conn, by_keys(conn.dialect.name, _SCHEDULES_OF_RUNS, task_schedule_run.c.id, chunk))


async def mark_schedules_of_tasks(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """Mark the schedules of these tasks that a run submitted (only those count towards a streak)."""
    task = tasks.c
    for chunk in chunked(in_id_order(task_ids)):
        named = of_tasks(conn.dialect.name, task.filed_at, chunk)  # their partitions, not every week's
        await _mark(conn, select(task.schedule_id).where(task.id.in_(chunk), named, task.run_id.is_not(None)))


async def _mark(conn: AsyncConnection, schedule_ids: Select[tuple[uuid.UUID]]) -> None:
    """Mark the enabled schedules among `schedule_ids` that pause after failures: a row each, whatever
    marks they have already (a mark already there may be taken by a look that reads before this
    transaction commits). No lock is taken on a mark, so two writers never wait for each other here."""
    owner = task_schedule.c
    pausing = select(owner.id).where(
        owner.id.in_(schedule_ids),
        owner.pause_after_failed_runs > 0,
        owner.enabled.is_(True),
    )
    await conn.execute(insert(failing_streak_checks).from_select(["schedule_id"], pausing))


async def any_marked(conn: AsyncConnection) -> bool:
    """Whether any schedule is marked: the whole of an idle poll's look (one primary-key index probe)."""
    return bool((await conn.execute(select(exists().select_from(failing_streak_checks)))).scalar())


async def mark_every_schedule(conn: AsyncConnection) -> None:
    """Mark every enabled schedule that pauses after failures (the look at everything: the bound on a mark
    never made), to be looked at over the next polls, a batch at a time. A schedule already marked gets
    no other row: this is no writer's change, and any look taking that mark reads after this began."""
    marked = select(failing_streak_checks.c.schedule_id).where(
        failing_streak_checks.c.schedule_id == task_schedule.c.id
    )
    await _mark(conn, select(task_schedule.c.id).where(~marked.exists()))


async def take_marked(db: Database, conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    """Remove the marks of up to `limit` marked schedules, the first in id order, and return those
    schedules, in id order. Every mark of theirs this transaction sees is removed, those whose writers
    have not committed are not (it cannot see them): they stay for a later look. Marks another instance is
    taking meanwhile are left to it (SKIP LOCKED on PostgreSQL; never a wait): if it took all of a
    schedule's, this look leaves that schedule out. The caller commits before it reads what decides their
    streaks."""
    marks = failing_streak_checks.c
    first = select(marks.schedule_id).distinct().order_by(marks.schedule_id).limit(limit)
    theirs = db.skip_locked(select(marks.seq).where(marks.schedule_id.in_(first.scalar_subquery())))
    stmt = (
        delete(failing_streak_checks)
        .where(marks.seq.in_(theirs.scalar_subquery()))
        .returning(marks.schedule_id)
    )
    return sorted(set((await conn.execute(stmt)).scalars()))
