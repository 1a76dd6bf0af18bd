"""The `instances` table: every rackflow process that runs tasks registers here and keeps a heartbeat.

The heartbeat is the lease on everything the instance owns (tasks with its `owner_id`): once it is older
than the lease time, or the row is gone, other instances treat the owner as dead and take its work over.
Heartbeats are written and compared with the database clock (`Database.now`), so skewed hosts agree.
Each function is a transaction of its own: registration never rides along with other work.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, insert, update
from sqlalchemy.sql.elements import ColumnElement

from rackflow.store.db import Database
from rackflow.store.dialect import now_minus, now_minus_params
from rackflow.store.tables import instances


async def register(db: Database, instance_id: uuid.UUID, *, host: str, pid: int) -> None:
    """Insert the instance, or refresh it when it is registered already (idempotent)."""
    async with db.transaction() as conn:
        now = await db.now(conn)
        refreshed = await conn.execute(
            update(instances)
            .where(instances.c.id == instance_id)
            .values(host=host, pid=pid, heartbeat_at=now)
        )
        if refreshed.rowcount == 0:
            await conn.execute(
                insert(instances).values(id=instance_id, host=host, pid=pid, started_at=now, heartbeat_at=now)
            )


async def heartbeat(db: Database, instance_id: uuid.UUID) -> bool:
    """Extend the lease; False when the row is gone (the caller registers again)."""
    async with db.transaction() as conn:
        now = await db.now(conn)
        result = await conn.execute(
            update(instances).where(instances.c.id == instance_id).values(heartbeat_at=now)
        )
    return result.rowcount == 1


async def unregister(db: Database, instance_id: uuid.UUID) -> None:
    """Give up the lease at once, so other instances take the work over without waiting for it to expire."""
    async with db.transaction() as conn:
        await conn.execute(delete(instances).where(instances.c.id == instance_id))


def lease_cutoff(db: Database) -> ColumnElement[datetime]:
    """SQL for "now minus the lease time" on the clock `Database.now` reads (the database's on PostgreSQL),
    so a statement compares heartbeats without first asking the database for the time. Its parameters
    come from `lease_params`."""
    return now_minus(db.dialect)


def lease_params(db: Database, lease_ttl: timedelta) -> dict[str, datetime | timedelta]:
    """The values `lease_cutoff` needs."""
    return now_minus_params(db.dialect, db.clock, lease_ttl)


def is_live(
    owner_id: ColumnElement[uuid.UUID], stale_before: datetime | ColumnElement[datetime]
) -> ColumnElement[bool]:
    """SQL condition: `owner_id` names an instance whose heartbeat is not older than `stale_before`."""
    return exists().where(instances.c.id == owner_id, instances.c.heartbeat_at >= stale_before)
