"""The stamp of a schedule's last scope removal (`task_schedule.scope_removed_after`, migration 0031), and
the one rule the runs grid reads it by (`may_have_left`).

The runs grid lists, after a schedule's scope, the racks of the shown runs that are no longer in it ("left":
removed from the scope, or deleted with their scope entries). Finding them reads every task or outcome of
the page's runs: 200,000 index entries for 20 runs of 10,000 racks, 79 ms at 1/10 size with half the
fleet outside the scope (docs/PERFORMANCE.md, "The runs grid: racks that left, skipped by a stamp"). Most
pages have none, and the stamp tells which.

**The stamp.** Every removal of a scope entry stamps its schedule in the removing transaction: the
schedule's row is locked (in id order; `FOR NO KEY UPDATE`, which excludes every other writer of the
row, as a run's recording, but lets a failing-streak mark check its key: the lock order atop
`rackflow.tasks.executor`), and then, in a later statement, `scope_removed_after` is set to
the newest `fired_at` among the schedule's runs, unless it holds a later one already (no run: unchanged).
The removals, all in the store, all through here:

- `store.schedules.delete_scopes` (`stamp_scopes`): UpdateTaskScheduleScope and AddTaskScheduleScope
  (`ScheduleService._apply`), RemoveTaskScheduleScope (`remove_scope`), and RemoveComponent emptying a
  component filter (`inventory.scope_removal`): the API, the dashboard's form and the CLI all end there;
- `store.inventory.delete_rack` (`stamp_racks`): DeleteRack, which deletes the rack's scope entries before
  the rack (ON DELETE CASCADE would take them too, unnamed in its audit event).

(Deleting a schedule takes its runs along: nothing to stamp. Retention deletes runs and tasks, never a
scope entry; a pruned run is on no page.)

**The rule** (`may_have_left`): the page's runs may hold a rack that left only if one of them fired at or
before its schedule's stamp; when every one fired after it (or there is none), the grid skips the read and
finds no rack that left. Why it is sound: let run R hold rack X, and X be out of the scope now.

1. R took its racks from the scope in the transaction that recorded it, holding the schedule's row lock
   from before that read to its commit: the dispatcher's claim (FOR UPDATE SKIP LOCKED), a manual trigger
   and RetryTaskScheduleRun (`ScheduleService._load(lock=True)`, then `firing.claim`) alike. A retry run's
   racks are its run's scope entries that still exist then (`scopes_by_ids`), read under the same lock, so
   a retry run is a run like any other here, and needs no exception. What later writes a run's outcomes
   (the write-back, a rollout's step, an approval) keeps its racks.
2. So X was removed after R's read, by a removal that stamped the schedule: its lock was granted only
   after R committed (had the removal held it first, R's read, a statement after R's lock, would not have
   found X: PostgreSQL's READ COMMITTED reads each statement anew, and SQLite has one writer), and its
   stamp is read in a statement after that lock, which sees R: the stamp is at least R's `fired_at`.
   A stamp only grows. So R fired at or before the stamp, and any page holding R reads who left.

No clock is compared with another: the stamp is a `fired_at`, written by whichever clock fired that run,
so an instance's clock skew can make the grid read more often, never less. A run that fired in the same
microsecond as the stamp counts as before it.

Online with the release before 0031 (a rolling upgrade): a removal it makes is not stamped (migration 0031,
docs/OPERATIONS.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import ComponentsFilter, filter_from_json
from rackflow.store import run_partitions
from rackflow.store.db import chunked
from rackflow.store.dialect import for_update
from rackflow.store.tables import task_schedule, task_schedule_run, task_schedule_scope

_schedule = task_schedule.c
_run = task_schedule_run.c
_scope = task_schedule_scope.c


async def stamp(conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]) -> None:
    """Stamp these schedules for a removal of scope entries in this transaction: each row locked, in id
    order, then its stamp raised to the newest `fired_at` of its runs. Call it in the removal's transaction
    (`stamp_scopes` and `stamp_racks` before its DELETE, which they find the schedules by)."""
    ids = sorted(set(schedule_ids))
    if not ids:
        return
    for chunk in chunked(ids):
        locked = select(_schedule.id).where(_schedule.id.in_(chunk)).order_by(_schedule.id)
        await conn.execute(for_update(conn.dialect.name, locked, keys_kept=True))
    # A statement after the locks: it sees every run whose recording transaction held one of them.
    newest = select(func.max(_run.fired_at)).where(_run.schedule_id == _schedule.id).scalar_subquery()
    raised: list[dict[str, object]] = []
    for chunk in chunked(ids):
        stmt = select(_schedule.id, _schedule.scope_removed_after, newest.label("newest")).where(
            _schedule.id.in_(chunk)
        )
        for row in await conn.execute(stmt):
            if row.newest is not None and (
                row.scope_removed_after is None or row.scope_removed_after < row.newest
            ):
                raised.append({"key": row.id, "stamp": row.newest})
    if raised:
        raise_stamps = (
            update(task_schedule)
            .where(_schedule.id == bindparam("key"))
            .values(scope_removed_after=bindparam("stamp"))
        )
        await conn.execute(raise_stamps, raised)


async def stamp_scopes(conn: AsyncConnection, scope_ids: Collection[uuid.UUID]) -> None:
    """`stamp` the schedules of these scope entries (`store.schedules.delete_scopes`)."""
    await stamp(conn, await _schedules_of(conn, _scope.id, scope_ids))


async def stamp_racks(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """`stamp` the schedules with a scope entry on these racks, and return them: DeleteRack calls it after
    it locked the runs of the rack's tasks (a run's row before its schedule's, as a retry of a run or a
    rollout's halt takes them) and before it locks the rack, so that it takes schedule rows before racks as
    the scope RPCs do; once it holds the rack, it tries again if an entry was added in between
    (`schedules_on_racks`), and the store's `delete_rack` stamps again, locks it holds already."""
    schedule_ids = await schedules_on_racks(conn, rack_ids)
    await stamp(conn, schedule_ids)
    return schedule_ids


async def schedules_on_racks(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """The schedules with a scope entry on these racks."""
    return await _schedules_of(conn, _scope.rack_id, rack_ids)


async def stamp_emptied_by(
    conn: AsyncConnection, rack_id: uuid.UUID, component_id: uuid.UUID
) -> set[uuid.UUID]:
    """`stamp` the schedules whose scope entry on the rack names this component alone, which removing the
    component removes (`inventory.scope_removal`), and return them: RemoveComponent calls it before it
    locks the rack, for the lock order `stamp_racks` keeps; once it holds the rack, it tries again if an
    entry was emptied in between (`emptied_by`), and `delete_scopes` stamps again, locks it holds already.
    Entries it only narrows are not scope removals, and their schedules are left unlocked."""
    emptied = await emptied_by(conn, rack_id, component_id)
    await stamp(conn, emptied)
    return emptied


async def emptied_by(conn: AsyncConnection, rack_id: uuid.UUID, component_id: uuid.UUID) -> set[uuid.UUID]:
    """The schedules whose scope entry on the rack names this component alone."""
    stmt = select(_scope.schedule_id, _scope.component_filter).where(
        _scope.rack_id == rack_id, _scope.component_filter.is_not(None)
    )
    emptied = set()
    for row in await conn.execute(stmt):
        value = filter_from_json(row.component_filter)
        if isinstance(value, ComponentsFilter) and value.ids <= {component_id}:
            emptied.add(row.schedule_id)
    return emptied


async def _schedules_of(conn: AsyncConnection, column: Any, keys: Collection[uuid.UUID]) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    for chunk in chunked(list(keys)):
        stmt = select(_scope.schedule_id).distinct().where(column.in_(chunk))
        found.update((await conn.execute(stmt)).scalars())
    return found


def fired_before(stamp: datetime | None, fired_at: datetime) -> bool:
    """The rule, for one run: whether it may hold a rack that has left its schedule's scope since it
    fired (it fired at or before the schedule's stamp)."""
    return stamp is not None and fired_at <= stamp


async def may_have_left(
    conn: AsyncConnection, schedule_id: uuid.UUID, run_ids: Collection[uuid.UUID]
) -> bool:
    """Whether any of these runs of the schedule may hold a rack no longer in its scope (`fired_before`),
    read by the runs' keys with the schedule's stamp:

        SELECT run.id, run.fired_at, s.scope_removed_after FROM task_schedule_run run
        JOIN task_schedule s ON s.id = run.schedule_id WHERE s.id = :schedule_id AND run.id IN (:run_ids)"""
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(_run.id, _run.fired_at, _schedule.scope_removed_after)
            .join_from(task_schedule_run, task_schedule, _schedule.id == _run.schedule_id)
            .where(_schedule.id == schedule_id, _run.id.in_(chunk))
        )
        rows = await run_partitions.read_runs(conn, chunk, stmt)  # in the runs' partitions
        if any(fired_before(row.scope_removed_after, row.fired_at) for row in rows):
            return True
    return False
