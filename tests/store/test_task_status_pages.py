"""The task list filtered by several statuses, paged: every page, by key or by offset, with or without a
rack, is the list's slice newest first, every task of those statuses exactly once, on both databases. Such a
page merges the newest of each status (`store.tasks._newest_of_each_status`); ties of creation time are
ordered by id, as in the list of one status. A schedule's list is merged so whatever its filter (its index
is keyed by status, migration 0058): every status, the live ones, several, one."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from rackflow.domain.tasks import Task, TaskStatus
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import racks, tasks
from tests.conftest import task_row

T0 = datetime(2026, 6, 1, tzinfo=UTC)
CYCLE = ["completed", "failed", "terminated", "pending", "failed", "completed", "terminated"]
WANTED = [TaskStatus.FAILED, TaskStatus.TERMINATED]


SCHEDULES = [uuid.uuid4(), uuid.uuid4(), uuid.uuid4()]


async def _fleet(db: Database) -> tuple[list[uuid.UUID], list[dict[str, object]]]:
    """210 tasks on two racks and three schedules, statuses in a cycle, three tasks to each creation time
    (ties)."""
    rack_ids = [uuid.uuid4(), uuid.uuid4()]
    rows = [
        task_row(
            uuid.uuid4(),
            rack_ids[n % 2],
            T0 + timedelta(minutes=n // 3),
            status=CYCLE[n % len(CYCLE)],
            schedule_id=SCHEDULES[n % 3],
        )
        for n in range(210)
    ]
    async with db.transaction() as conn:
        for n, rack_id in enumerate(rack_ids):
            await conn.execute(insert(racks).values(id=rack_id, name=f"r{n}", created_at=T0))
        await conn.execute(insert(tasks), rows)
    return rack_ids, rows


def _expected(
    rows: list[dict[str, object]],
    rack_id: uuid.UUID | None,
    wanted: Collection[TaskStatus] = WANTED,
    schedule_id: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    kept = [
        r
        for r in rows
        if r["status"] in {s.value for s in wanted}
        and (rack_id is None or r["rack_id"] == rack_id)
        and (schedule_id is None or r["schedule_id"] == schedule_id)
    ]
    kept.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)  # type: ignore[arg-type, return-value]
    return [r["id"] for r in kept]  # type: ignore[misc]


async def _page(
    db: Database,
    rack_id: uuid.UUID | None,
    statuses: Collection[TaskStatus] = WANTED,
    **filters: Any,
) -> tuple[list[Task], int]:
    async with db.read(in_transaction=True) as conn:
        return await task_store.list_tasks(
            conn, rack_id=rack_id, statuses=statuses, **{"schedule_id": None, "active_only": False, **filters}
        )


async def _pages_are_the_list(db: Database, expected: list[uuid.UUID], **filters: Any) -> None:
    """Paged by key and by offset, 7 a page, and unpaged, the list is `expected` in order."""
    by_key: list[uuid.UUID] = []
    after = None
    while True:
        found, total = await _page(db, offset=0, limit=7, after=after, **filters)
        assert total == len(expected)
        by_key += [t.id for t in found]
        if len(found) < 7:
            break
        after = (found[-1].created_at, found[-1].id)
    assert by_key == expected
    by_offset: list[uuid.UUID] = []
    for offset in range(0, len(expected) + 7, 7):
        found, _ = await _page(db, offset=offset, limit=7, **filters)
        by_offset += [t.id for t in found]
    assert by_offset == expected
    whole, _ = await _page(db, offset=0, limit=None, **filters)
    assert [t.id for t in whole] == expected


async def test_pages_of_several_statuses_by_key_and_by_offset_are_the_list_in_order(db: Database) -> None:
    rack_ids, rows = await _fleet(db)
    for rack_id in (None, rack_ids[1]):
        await _pages_are_the_list(db, _expected(rows, rack_id), rack_id=rack_id)


async def test_pages_of_a_schedule_s_tasks_are_its_list_in_order_whatever_the_filter(db: Database) -> None:
    rack_ids, rows = await _fleet(db)
    schedule = SCHEDULES[1]
    every, live = list(TaskStatus), [s for s in TaskStatus if s.is_active]
    for rack_id in (None, rack_ids[0]):
        for statuses, active_only, wanted in (
            ((), False, every),
            ((), True, live),
            (WANTED, False, WANTED),
            ([TaskStatus.FAILED], False, [TaskStatus.FAILED]),
            ([TaskStatus.FAILED, TaskStatus.PENDING], True, [TaskStatus.PENDING]),
        ):
            expected = _expected(rows, rack_id, wanted, schedule)
            await _pages_are_the_list(
                db,
                expected,
                rack_id=rack_id,
                statuses=statuses,
                schedule_id=schedule,
                active_only=active_only,
            )
