"""What the migrations of the index of a schedule's tasks (0052, 0058) and its plans are tested with: a
schedule's tasks in two statuses, the indexes of `tasks` led by the schedule, and the list read back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, insert, inspect
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import Task, TaskStatus
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import racks, task_schedule, tasks
from tests.conftest import schedule_row, task_row

T0 = datetime(2026, 6, 1, tzinfo=UTC)


async def made_tasks(db: Database) -> tuple[uuid.UUID, dict[str, list[uuid.UUID]]]:
    """A schedule with four completed tasks and two failed ones, written with the columns every revision
    since 0022 has: the schedule, and its tasks' ids by status and all of them ("every"), newest first."""
    rack, schedule = uuid.uuid4(), uuid.uuid4()
    made: dict[str, list[uuid.UUID]] = {"completed": [], "failed": [], "every": []}
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        await conn.execute(insert(task_schedule).values(**schedule_row(schedule, "nightly", T0)))
        for n in range(6):
            status = "failed" if n % 3 == 1 else "completed"
            row = task_row(uuid.uuid4(), rack, T0 + timedelta(minutes=n), schedule_id=schedule, status=status)
            await conn.execute(insert(tasks).values(**row))
            made[status].insert(0, row["id"])  # type: ignore[arg-type]
            made["every"].insert(0, row["id"])  # type: ignore[arg-type]
    return schedule, made


def schedule_indexes(conn: Connection) -> dict[str, list[str]]:
    """The indexes of tasks led by the schedule: name -> their columns, the INCLUDEd ones after "+"."""
    found = {}
    for index in inspect(conn).get_indexes("tasks"):
        if index["column_names"][:1] == ["schedule_id"]:
            included = index.get("include_columns") or index.get("dialect_options", {}).get(
                "postgresql_include"
            )
            found[index["name"]] = [*index["column_names"], *(f"+{c}" for c in included or [])]
    return found


async def first_page(
    conn: AsyncConnection, schedule: uuid.UUID | None, statuses: list[TaskStatus], limit: int
) -> tuple[list[Task], int]:
    """The first page of `limit` of the task list (of `schedule` if given, of `statuses` if any), newest
    first, and its count, as the list RPC reads them."""
    return await task_store.list_tasks(
        conn,
        rack_id=None,
        schedule_id=schedule,
        active_only=False,
        statuses=statuses,
        offset=0,
        limit=limit,
    )


async def listed(db: Database, schedule: uuid.UUID, status: TaskStatus | None = None) -> list[uuid.UUID]:
    """The schedule's tasks of `status` (None: every status), a page of 10, newest first; the list's count
    checked against the page."""
    async with db.read(in_transaction=True) as conn:
        found, total = await first_page(conn, schedule, [status] if status else [], 10)
    assert total == len(found)
    return [t.id for t in found]
