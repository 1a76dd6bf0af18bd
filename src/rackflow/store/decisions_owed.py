"""The tasks a window's change still owes a decision (`rackflow.tasks.deferrals`): the only module that
speaks SQL to `window_decisions_owed`.

A row is written in the change's transaction, for a task it skipped (a claim held its row), and deleted by
the transaction that decides the task again; a task decided twice (two changes, or a change's instance and
an executor's look again) is only decided again by the windows as they are, which is harmless. No row
locks a task's: the table has no foreign key to `tasks`, whose check would wait for the claim that holds
the row.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import chunked, in_id_order
from rackflow.store.dialect import insert_new
from rackflow.store.tables import window_decisions_owed

_OWED = window_decisions_owed.c


async def owe(conn: AsyncConnection, task_ids: Collection[uuid.UUID], now: datetime) -> None:
    """Record, in the caller's transaction, that these tasks are owed a decision (those already owed keep
    their row, and when they were first owed)."""
    if not task_ids:
        return
    rows = [{"task_id": task_id, "owed_since": now} for task_id in in_id_order(task_ids)]
    await conn.execute(insert_new(conn.dialect.name, window_decisions_owed), rows)


async def settle(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """In the caller's transaction, which decided these tasks: none of them is owed any more."""
    for chunk in chunked(in_id_order(task_ids)):
        await conn.execute(delete(window_decisions_owed).where(_OWED.task_id.in_(chunk)))


async def owed(conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    """Up to `limit` of the tasks owed a decision, in id order: one read of the primary key, which finds
    nothing but when a change's instance did not live (or failed) to decide them."""
    stmt = select(_OWED.task_id).order_by(_OWED.task_id).limit(limit)
    return list((await conn.execute(stmt)).scalars())
