"""A run's tasks by status, kept in its row once they can no longer change (`task_schedule_run.task_counts`,
migration 0031), so the runs grid reads 20 small columns where it counted 200,000 index entries (the
page's one read that grows with the runs' racks: 88–105 ms at 1/10 size, docs/PERFORMANCE.md, "The runs
grid: racks that left, skipped by a stamp").

**When a count is final.** A run in a `FINAL_STATES` state gets no new task: a plain firing is `completed`
by the write-back after it submitted its tasks, a rollout `completed` or `cancelled` under its row lock
after its last step (a retry is a new run; an attempt's retry is the same task). A task that ended
(completed, failed, terminated) never changes status again (an attempt with attempts left goes back to
PENDING from RUNNING, never from an end). So a count of such a run's tasks that finds every one ended, read
after the run was seen in a final state, stays its count while none of its tasks is deleted. (Not
`interrupted`: its owner may still be writing back. The states of runs with no task need no keeping.)

**Deletion.** Tasks are deleted with their rack (`store.inventory.delete_rack`, ON DELETE CASCADE), which
marks the runs of the tasks it deletes (`mark_deleted`: `tasks_deleted`, never cleared) in its
transaction; and by retention (`store.tasks.prune_finished_tasks`), which marks no run: before it deletes
anything it raises `task_prune_horizon` to its cutoff (`raise_horizon`, committed on its own), and it
deletes only tasks created before that cutoff. A run's tasks are made when it fires or later (a rollout's
waves, an approval), so a run fired at or after the horizon has lost no task to retention; a kept count is
read only for such a run, with `HORIZON_MARGIN` for the clocks of the instances that fired the run and made
its tasks. A count is kept only on a row not marked (a conditional UPDATE, which on PostgreSQL re-reads a
row a concurrent deletion changed), and read only from a row not marked and fired after the horizon: a
deletion that commits after the count was taken either marked the row or raised the horizon before it
deleted, so a kept count is never read after a deletion of its tasks. Marking every run of a prune's tasks
instead made the prune 1.6–1.7 times as slow, with 13 times the WAL a task (docs/PERFORMANCE.md, "At full
size on a quiet machine").

**Who keeps it.** The runs grid, after it counted a page's runs (`ScheduleService.grid_outcomes`): the
states are read in a statement before the count, so a run seen final there had all its tasks when they
were counted. A run that is never shown in a grid is never kept, and costs nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import TaskStatus
from rackflow.store import run_partitions
from rackflow.store.db import chunked
from rackflow.store.dialect import insert_new
from rackflow.store.tables import task_prune_horizon, task_schedule_run

FINAL_STATES = ("completed", "cancelled")
# How far apart two instances' clocks may be: a run's tasks are made by the instance that fired it or, for
# a rollout's later waves, by another; a task made by a clock behind may be dated before its run fired.
HORIZON_MARGIN = timedelta(hours=1)

_run = task_schedule_run.c


def is_final(state: str, counts: Mapping[TaskStatus, int]) -> bool:
    """Whether a count of a run's tasks, taken after the run was seen in `state`, is final."""
    return state in FINAL_STATES and not any(status.is_active for status in counts)


async def kept(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> tuple[dict[uuid.UUID, dict[TaskStatus, int]], dict[uuid.UUID, str]]:
    """The kept counts of these runs that have one (no task deleted with its rack since, and fired after
    the task prune's horizon), and the state of the others (read before they are counted: `is_final`)."""
    found: dict[uuid.UUID, dict[TaskStatus, int]] = {}
    states: dict[uuid.UUID, str] = {}
    horizon = await _horizon(conn)
    for chunk in chunked(list(run_ids)):
        stmt = select(_run.id, _run.state, _run.fired_at, _run.task_counts, _run.tasks_deleted).where(
            _run.id.in_(chunk)
        )
        for row in await run_partitions.read_runs(conn, chunk, stmt):  # in their partitions
            pruned = horizon is not None and row.fired_at < horizon + HORIZON_MARGIN
            if row.task_counts is not None and not row.tasks_deleted and not pruned:
                found[row.id] = {TaskStatus(status): count for status, count in row.task_counts.items()}
            else:
                states[row.id] = row.state
    return found, states


async def keep(conn: AsyncConnection, counts: Mapping[uuid.UUID, Mapping[TaskStatus, int]]) -> None:
    """Keep these final counts (`is_final`), each on a row not marked `tasks_deleted`, each UPDATE bounded
    to its run's partitions (`run_partitions.SLOTS`, from its id). A run an instance of the previous
    release recorded in a week's partition (its id not its slot's) is not found: its count is not kept,
    and is counted again at each look (`store.run_partitions`)."""
    if not counts:
        return
    stmt = update(task_schedule_run).where(
        _run.id == bindparam("key"),
        _run.task_counts.is_(None),
        _run.tasks_deleted.is_not(True),
    )
    rows: list[dict[str, object]] = []
    bounded = False
    for run_id, c in sorted(counts.items()):
        bounds = await run_partitions.slot_bounds(conn, [run_id])  # None: not partitioned (any run's)
        bounded = bounds is not None
        rows.append({"key": run_id, "counts": {status.value: n for status, n in c.items()}, **(bounds or {})})
    if bounded:
        stmt = stmt.where(run_partitions.SLOTS)
    await conn.execute(stmt.values(task_counts=bindparam("counts")), rows)


async def mark_deleted(conn: AsyncConnection, run_ids: Collection[uuid.UUID | None]) -> None:
    """Mark the runs some of whose tasks this transaction deletes: their kept counts are not read again."""
    ids = sorted({run_id for run_id in run_ids if run_id is not None})
    for chunk in chunked(ids):
        await conn.execute(
            update(task_schedule_run)
            .where(_run.id.in_(chunk), _run.tasks_deleted.is_not(True))
            .values(tasks_deleted=True)
        )


async def raise_horizon(conn: AsyncConnection, cutoff: datetime) -> None:
    """Before the task prune deletes the tasks created before `cutoff`: the kept counts of runs fired
    before it (by `HORIZON_MARGIN`) are not read again. Commit it before deleting."""
    horizon = task_prune_horizon.c
    await conn.execute(insert_new(conn.dialect.name, task_prune_horizon).values(id=1, pruned_before=cutoff))
    await conn.execute(
        update(task_prune_horizon)
        .where(horizon.id == 1, horizon.pruned_before < cutoff)
        .values(pruned_before=cutoff)
    )


async def _horizon(conn: AsyncConnection) -> datetime | None:
    stmt = select(task_prune_horizon.c.pruned_before).where(task_prune_horizon.c.id == 1)
    return (await conn.execute(stmt)).scalar_one_or_none()
