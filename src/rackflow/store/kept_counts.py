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

**Deletion.** Tasks are deleted by retention (`store.tasks.prune_finished_tasks`) and with their rack
(`store.inventory.delete_rack`, ON DELETE CASCADE); each marks the runs of the tasks it deletes
(`mark_deleted`: `tasks_deleted`, never cleared) in its transaction. A count is kept only on a row not
marked (a conditional UPDATE, which on PostgreSQL re-reads a row a concurrent deletion changed), and read
only from a row not marked: a deletion that commits after the count was taken marks the row whatever the
order, so a kept count is never read after a deletion of its tasks.

**Who keeps it.** The runs grid, after it counted a page's runs (`ScheduleService.grid_outcomes`): the
states are read in a statement before the count, so a run seen final there had all its tasks when they
were counted. A run that is never shown in a grid is never kept, and costs nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import TaskStatus
from rackflow.store.db import chunked
from rackflow.store.tables import task_schedule_run

FINAL_STATES = ("completed", "cancelled")

_run = task_schedule_run.c


def is_final(state: str, counts: Mapping[TaskStatus, int]) -> bool:
    """Whether a count of a run's tasks, taken after the run was seen in `state`, is final."""
    return state in FINAL_STATES and not any(status.is_active for status in counts)


async def kept(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> tuple[dict[uuid.UUID, dict[TaskStatus, int]], dict[uuid.UUID, str]]:
    """The kept counts of these runs that have one (and no task deleted since), and the state of the
    others (read before they are counted: `is_final`)."""
    found: dict[uuid.UUID, dict[TaskStatus, int]] = {}
    states: dict[uuid.UUID, str] = {}
    for chunk in chunked(list(run_ids)):
        stmt = select(_run.id, _run.state, _run.task_counts, _run.tasks_deleted).where(_run.id.in_(chunk))
        for row in await conn.execute(stmt):
            if row.task_counts is not None and not row.tasks_deleted:
                found[row.id] = {TaskStatus(status): count for status, count in row.task_counts.items()}
            else:
                states[row.id] = row.state
    return found, states


async def keep(conn: AsyncConnection, counts: Mapping[uuid.UUID, Mapping[TaskStatus, int]]) -> None:
    """Keep these final counts (`is_final`), each on a row not marked `tasks_deleted`."""
    if not counts:
        return
    stmt = (
        update(task_schedule_run)
        .where(
            _run.id == bindparam("key"),
            _run.task_counts.is_(None),
            _run.tasks_deleted.is_not(True),
        )
        .values(task_counts=bindparam("counts"))
    )
    rows = [
        {"key": run_id, "counts": {status.value: n for status, n in c.items()}}
        for run_id, c in sorted(counts.items())
    ]
    await conn.execute(stmt, rows)


async def mark_deleted(conn: AsyncConnection, run_ids: Collection[uuid.UUID | None]) -> None:
    """Mark the runs some of whose tasks this transaction deletes: their kept counts are not read again."""
    ids = sorted({run_id for run_id in run_ids if run_id is not None})
    for chunk in chunked(ids):
        await conn.execute(
            update(task_schedule_run)
            .where(_run.id.in_(chunk), _run.tasks_deleted.is_not(True))
            .values(tasks_deleted=True)
        )
