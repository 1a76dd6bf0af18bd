"""The dispatcher's queries: claim due schedules, advance them, and mark abandoned runs.

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
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.schedules.model import Schedule, Scope
from rackflow.store.db import Database, chunked
from rackflow.store.schedules import schedule_from_row, scope_from_row
from rackflow.store.tables import instances, task_schedule, task_schedule_run, task_schedule_scope

# A firing's phases 2-3 take seconds; a run still "running" this long after it fired is stuck (its owner
# lost it, or is a manual trigger's process that died) whoever owns it.
STUCK_RUN_AGE = timedelta(minutes=10)


def _due(now: datetime):  # type: ignore[no-untyped-def]
    return and_(
        task_schedule.c.enabled.is_(True),
        task_schedule.c.next_run_at.is_not(None),
        task_schedule.c.next_run_at <= now,
    )


async def claim_due(
    db: Database, conn: AsyncConnection, now: datetime, batch: int, *, exclude: Collection[uuid.UUID] = ()
) -> list[Schedule]:
    """Lock up to `batch` due schedules, oldest due first, skipping rows other instances hold and the ids
    in `exclude`."""
    stmt = select(task_schedule).where(_due(now)).order_by(task_schedule.c.next_run_at, task_schedule.c.id)
    if exclude:
        stmt = stmt.where(task_schedule.c.id.not_in(list(exclude)))
    rows = (await conn.execute(db.skip_locked(stmt.limit(batch)))).all()
    return [schedule_from_row(row) for row in rows]


async def count_due(conn: AsyncConnection, now: datetime) -> int:
    """How many schedules are due right now (the backlog gauge)."""
    return int((await conn.execute(select(func.count()).where(_due(now)))).scalar_one())


async def scopes_by_schedule(
    conn: AsyncConnection, schedule_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Scope]]:
    """Every claimed schedule's scopes, in creation order, with one query per chunk of schedules."""
    found: dict[uuid.UUID, list[Scope]] = {sid: [] for sid in schedule_ids}
    for chunk in chunked(list(schedule_ids)):
        stmt = (
            select(task_schedule_scope)
            .where(task_schedule_scope.c.schedule_id.in_(chunk))
            .order_by(task_schedule_scope.c.created_at, task_schedule_scope.c.id)
        )
        for row in (await conn.execute(stmt)).all():
            found[row.schedule_id].append(scope_from_row(row))
    return found


@dataclass(frozen=True)
class Advance:
    """The new timing of one claimed schedule."""

    schedule_id: uuid.UUID
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime


async def advance(conn: AsyncConnection, advances: Sequence[Advance], now: datetime) -> None:
    """Write every claimed schedule's new timing in one executemany."""
    if not advances:
        return
    stmt = (
        update(task_schedule)
        .where(task_schedule.c.id == bindparam("b_id"))
        .values(
            enabled=bindparam("b_enabled"),
            next_run_at=bindparam("b_next"),
            last_run_at=bindparam("b_last"),
            updated_at=bindparam("b_now"),
        )
    )
    await conn.execute(
        stmt,
        [
            {
                "b_id": a.schedule_id,
                "b_enabled": a.enabled,
                "b_next": a.next_run_at,
                "b_last": a.last_run_at,
                "b_now": now,
            }
            for a in advances
        ],
    )


async def mark_abandoned_runs(conn: AsyncConnection, now: datetime, lease_ttl: timedelta) -> int:
    """Runs left "running" by an instance whose heartbeat stopped, or for longer than STUCK_RUN_AGE, become
    "interrupted".

    Such a run was claimed (its tick is spent, at most once) but its process died before phase 3; the
    operator sees it in run history instead of silence. Returns how many were marked.
    """
    live = select(instances.c.id).where(instances.c.heartbeat_at > now - lease_ttl)
    result = await conn.execute(
        update(task_schedule_run)
        .where(
            task_schedule_run.c.state == "running",
            or_(
                and_(task_schedule_run.c.owner_id.is_not(None), task_schedule_run.c.owner_id.not_in(live)),
                task_schedule_run.c.fired_at < now - STUCK_RUN_AGE,
            ),
        )
        .values(state="interrupted")
    )
    return int(result.rowcount or 0)
