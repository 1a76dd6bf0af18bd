"""The tasks a window's change still owes a decision (`rackflow.tasks.deferrals`): the only module that
speaks SQL to `window_decisions_owed`.

A row is written in the change's transaction, for a task it skipped (a claim held its row), and deleted by
the transaction that decides the task again. Two may set out to decide the same task (a change's instance
and an executor's look again, two executors' looks): each reads which of its tasks are still owed once it
has the window edits' turn (`recorded`), and decides only those, so the second finds the task owed no
more and decides nothing (one decision, one audit event, which names its cause). Every writer of the table
holds that turn (a change and a decision in its exclusive form, a firing's submit in its shared form:
`store.windows`), so what a decision read stays so until it commits. No row locks a task's: the table has
no foreign key to `tasks`, whose check would wait for the claim that holds the row.

Each row keeps what made the task owed (`cause`, JSON: `rackflow.audit.decisions.owed_by_change` and
`owed_by_submit` make it, migration 0050), which the decision's audit event names; this module stores and
returns it as given. A row a release before 0050 wrote has none (NULL), read back as None.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import chunked, in_id_order
from rackflow.store.dialect import insert_new
from rackflow.store.tables import window_decisions_owed

_OWED = window_decisions_owed.c


class Owed(NamedTuple):
    """A task's record, as the transaction that decided it found it: since when it was owed, and why (None:
    a release before migration 0050 recorded no cause)."""

    owed_since: datetime
    cause: dict[str, Any] | None


async def owe(conn: AsyncConnection, causes: Mapping[uuid.UUID, Mapping[str, Any]], now: datetime) -> None:
    """Record, in the caller's transaction, that these tasks (the keys) are owed a decision, each for its
    cause (those already owed keep their row: when they were first owed, and why)."""
    if not causes:
        return
    rows = [
        {"task_id": task_id, "owed_since": now, "cause": dict(causes[task_id])}
        for task_id in in_id_order(causes)
    ]
    await conn.execute(insert_new(conn.dialect.name, window_decisions_owed), rows)


async def recorded(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Owed]:
    """The records of those of these tasks still owed a decision, read in the caller's transaction, which
    holds the window edits' turn (the module's docstring): the tasks it is to decide, each with the cause
    its decision's audit event names. A task another transaction decided first is not in it."""
    found: dict[uuid.UUID, Owed] = {}
    for chunk in chunked(in_id_order(task_ids)):
        stmt = select(_OWED.task_id, _OWED.owed_since, _OWED.cause).where(_OWED.task_id.in_(chunk))
        for row in await conn.execute(stmt):
            found[row.task_id] = Owed(row.owed_since, row.cause)
    return found


async def settle(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """In the caller's transaction, which decided these tasks (`recorded` found them owed): none of them is
    owed any more."""
    for chunk in chunked(in_id_order(task_ids)):
        await conn.execute(delete(window_decisions_owed).where(_OWED.task_id.in_(chunk)))


async def owed(conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    """Up to `limit` of the tasks owed a decision, in id order: one read of the primary key, which finds
    nothing but when a change's instance did not live (or failed) to decide them."""
    stmt = select(_OWED.task_id).order_by(_OWED.task_id).limit(limit)
    return list((await conn.execute(stmt)).scalars())
