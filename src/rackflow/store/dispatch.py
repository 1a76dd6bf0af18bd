"""The dispatcher's queries: claim due schedules, count them, look up a claim in doubt, and mark abandoned
runs.

(What a claim writes, for the dispatcher and manual triggers alike, is in `store.schedules` and `store.runs`:
scopes by schedule, `advance`, `insert_runs`.)

The claim is the one place where instances compete, so it reads as plain SQL:

    SELECT * FROM task_schedule
    WHERE enabled AND next_run_at IS NOT NULL AND next_run_at <= :now   -- partial index ix_task_schedule_due
    ORDER BY next_run_at, id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED                                                  -- PostgreSQL only

A row another instance has locked is skipped, not waited for; once the claiming transaction commits the
advanced `next_run_at`, the row is no longer due for anyone. SQLite has one writer, so the same SELECT inside
its `BEGIN IMMEDIATE` transaction is already exclusive.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.config import DUE_COUNT_CAP
from rackflow.domain.schedules import Schedule
from rackflow.store import run_partitions
from rackflow.store.db import Database, chunked, in_id_order
from rackflow.store.dialect import for_update, locks_rows, not_in_keys
from rackflow.store.runs import in_state
from rackflow.store.schedules import schedule_from_row
from rackflow.store.streak_checks import mark_schedules
from rackflow.store.tables import instances, task_schedule, task_schedule_run

# A firing's phases 2-3 take seconds; a run still "running" this long after it fired is stuck (its owner
# lost it, or is a manual trigger's process that died) whoever owns it.
STUCK_RUN_AGE = timedelta(minutes=10)


def _scheduled() -> ColumnElement[bool]:
    """The rows the due index holds: enabled, with a next run."""
    return and_(task_schedule.c.enabled.is_(True), task_schedule.c.next_run_at.is_not(None))


def _due(now: datetime) -> ColumnElement[bool]:
    return and_(_scheduled(), task_schedule.c.next_run_at <= now)


async def claim_due(
    db: Database, conn: AsyncConnection, now: datetime, batch: int, *, exclude: Collection[uuid.UUID] = ()
) -> list[Schedule]:
    """Lock up to `batch` due schedules, oldest due first, skipping rows other instances hold and the ids
    in `exclude`."""
    stmt = select(task_schedule).where(_due(now)).order_by(task_schedule.c.next_run_at, task_schedule.c.id)
    if exclude:
        stmt = stmt.where(not_in_keys(db.dialect, task_schedule.c.id, list(exclude)))
    rows = (await conn.execute(db.skip_locked(stmt.limit(batch)))).all()
    return [schedule_from_row(row) for row in rows]


async def count_due(conn: AsyncConnection, now: datetime) -> int:
    """How many schedules are due right now, counted up to DUE_COUNT_CAP (the backlog gauge and the
    dashboard's backlog; the cap means "at least that many").

    SELECT count(*) FROM (SELECT id FROM task_schedule
                          WHERE enabled AND next_run_at IS NOT NULL AND next_run_at <= :now
                          ORDER BY next_run_at, id LIMIT :cap) AS due   -- the due index's first entries

    A plain count read every due row, every second of a drain: the whole table on PostgreSQL at a
    20,000-schedule backlog (docs/PERFORMANCE.md, "flat as work grows"). In the claim's order and limited,
    it walks at most DUE_COUNT_CAP entries of ix_task_schedule_due.
    """
    due = (
        select(task_schedule.c.id)
        .where(_due(now))
        .order_by(task_schedule.c.next_run_at, task_schedule.c.id)
        .limit(DUE_COUNT_CAP)
        .subquery("due")
    )
    return int((await conn.execute(select(func.count()).select_from(due))).scalar_one())


async def next_due_at(conn: AsyncConnection, now: datetime) -> datetime | None:
    """When the dispatcher next has something to do: the earliest `next_run_at` of an enabled schedule or
    `resume_at` of a paused one after `now` (the dispatcher sleeps until then), or None.

    Only times after `now`: a schedule due already that the claim did not take (one this process is still
    firing, or one another instance holds), or a pause ended that this poll's look resumes, would
    otherwise hide every later time, and the dispatcher would sleep its whole interval.

    SELECT (SELECT min(next_run_at) FROM task_schedule
            WHERE enabled AND next_run_at > :now),                -- the due index, from now
           (SELECT min(resume_at) FROM task_schedule
            WHERE resume_at IS NOT NULL AND resume_at > :now)     -- ix_task_schedule_resume_at, from now
    """
    next_run = (
        select(func.min(task_schedule.c.next_run_at))
        .where(_scheduled(), task_schedule.c.next_run_at > now)
        .scalar_subquery()
    )
    pause_end = (
        select(func.min(task_schedule.c.resume_at))
        .where(task_schedule.c.resume_at.is_not(None), task_schedule.c.resume_at > now)
        .scalar_subquery()
    )
    row = (await conn.execute(select(next_run, pause_end))).one()
    times = [value for value in row if isinstance(value, datetime)]
    return min(times, default=None)


async def claimed_runs(
    db: Database, conn: AsyncConnection, schedule_ids: Collection[uuid.UUID], run_ids: Collection[uuid.UUID]
) -> set[uuid.UUID]:
    """Which of `run_ids` a claim whose COMMIT went unanswered recorded: all of them if it committed, none
    if it did not, and never an answer while it may still commit.

    The claim held its schedules' rows locked until it ended, so once this transaction holds them the claim
    is over, whatever the server made of the lost connection. On PostgreSQL the lock is taken NOWAIT: a
    claim still open on the server (its connection cut without the server knowing yet) fails this at once
    (LockNotAvailable), for the caller to ask again later, rather than holding the caller for as long as the
    server takes to notice. SQLite's writer lock, which this transaction holds, says the same.

    The runs are looked for in their partitions alone (`run_partitions.of_runs`): this instance named
    them, each by its slot or, manual, made now.
    """
    for chunk in chunked(in_id_order(schedule_ids)):
        locked = select(task_schedule.c.id).where(task_schedule.c.id.in_(chunk))
        await conn.execute(db.for_update(locked, nowait=True))
    recorded: set[uuid.UUID] = set()
    for chunk in chunked(list(run_ids)):
        in_partitions = await run_partitions.of_runs(conn, chunk)  # the runs' ids are this release's
        found = select(task_schedule_run.c.id).where(task_schedule_run.c.id.in_(chunk), in_partitions)
        recorded.update((await conn.execute(found)).scalars())
    return recorded


async def mark_abandoned_runs(conn: AsyncConnection, now: datetime, lease_ttl: timedelta) -> int:
    """Runs left "running" by an instance whose heartbeat stopped, or for longer than STUCK_RUN_AGE, become
    "interrupted".

    Such a run was claimed (its tick is spent, at most once) but its process died before phase 3; the
    operator sees it in run history instead of silence. Returns how many were marked. A run's time running
    counts from when it started: its approval for one that awaited it (`started_at`, possibly long after
    it fired, and its write-back under way), else its firing.

    A "rolling" run is not swept, and has no owner (`runs.owned`): every instance's rollout driver
    steps it, so a rollout whose instance died goes on at another's next step (`rollouts.driver`) rather
    than being left stuck; its tasks are the executors', taken over by their own leases.

    On PostgreSQL the runs are locked first, in id order (`FOR NO KEY UPDATE`, as their UPDATE would), as
    DeleteSchedule locks a schedule's runs before it deletes them: an UPDATE alone locks its rows in its
    plan's order, and two abandoned runs of a schedule being deleted, each held by one of the two, made a
    deadlock (tests/store/test_schedule_lock_order.py). The locking read is the sweep's one statement while
    nothing is abandoned (the partial index of the running runs, in every week's partition, planned as the
    UPDATE alone was); the UPDATE of what it found is bounded to those runs' partitions by their slots
    (`run_partitions.of_slots`). SQLite's single writer needs no lock: there it is the UPDATE alone.
    """
    run = task_schedule_run.c
    live = select(instances.c.id).where(instances.c.heartbeat_at > now - lease_ttl)
    abandoned = and_(
        run.state == "running",
        or_(
            and_(run.owner_id.is_not(None), run.owner_id.not_in(live)),
            func.coalesce(run.started_at, run.fired_at) < now - STUCK_RUN_AGE,
        ),
    )
    # interrupted, and no owner (`runs.in_state`)
    interrupt = update(task_schedule_run).values(in_state("interrupted")).returning(run.schedule_id)
    schedule_ids: list[uuid.UUID] = []
    if not locks_rows(conn.dialect.name):
        schedule_ids += (await conn.execute(interrupt.where(abandoned))).scalars()
    else:
        in_order = select(run.id, run.scheduled_for).where(abandoned).order_by(run.id)
        locked = (await conn.execute(for_update(conn.dialect.name, in_order, keys_kept=True))).all()
        for chunk in chunked(locked):
            in_partitions = await run_partitions.of_slots(conn, [row.scheduled_for for row in chunk])
            stmt = interrupt.where(run.id.in_([row.id for row in chunk]), in_partitions)
            schedule_ids += (await conn.execute(stmt)).scalars()
    await mark_schedules(conn, schedule_ids)  # an interrupted run has finished (store.streak_checks)
    return len(schedule_ids)
