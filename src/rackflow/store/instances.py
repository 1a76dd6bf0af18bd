"""The `instances` table: every rackflow process that runs tasks registers here and keeps a heartbeat.

The heartbeat is the lease on everything the instance owns (tasks with its `owner_id`): once it is older
than the lease time, or the row is gone, other instances treat the owner as dead and take its work over.
Heartbeats are written and compared with the database clock (`Database.now`), so skewed hosts agree.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, exists, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from rackflow.store.tables import instances


@dataclass(frozen=True)
class Instance:
    id: uuid.UUID
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime


async def register(conn: AsyncConnection, instance_id: uuid.UUID, *, host: str, pid: int,
                   now: datetime) -> None:
    """Insert the instance, or refresh it when it is registered already (a restart with the same id)."""
    refreshed = await conn.execute(
        update(instances)
        .where(instances.c.id == instance_id)
        .values(host=host, pid=pid, heartbeat_at=now)
    )
    if refreshed.rowcount == 0:
        await conn.execute(
            insert(instances).values(id=instance_id, host=host, pid=pid, started_at=now, heartbeat_at=now)
        )


async def heartbeat(conn: AsyncConnection, instance_id: uuid.UUID, now: datetime) -> bool:
    """Extend the lease; False when the row is gone (the caller registers again)."""
    result = await conn.execute(
        update(instances).where(instances.c.id == instance_id).values(heartbeat_at=now)
    )
    return result.rowcount == 1


async def deregister(conn: AsyncConnection, instance_id: uuid.UUID) -> None:
    """Give up the lease at once, so other instances take the work over without waiting for it to expire."""
    await conn.execute(delete(instances).where(instances.c.id == instance_id))


async def live_instances(conn: AsyncConnection, stale_before: datetime) -> list[Instance]:
    """Instances whose heartbeat is not older than `stale_before`, oldest first."""
    rows = await conn.execute(
        select(instances).where(instances.c.heartbeat_at >= stale_before).order_by(instances.c.started_at)
    )
    return [Instance(r.id, r.host, r.pid, r.started_at, r.heartbeat_at) for r in rows]


def is_live(owner_id: ColumnElement[uuid.UUID], stale_before: datetime) -> ColumnElement[bool]:
    """SQL condition: `owner_id` names an instance whose lease has not expired."""
    return exists().where(instances.c.id == owner_id, instances.c.heartbeat_at >= stale_before)
