"""Migration 0037 on a database holding dispatched and manual runs, on both databases: every row kept, the
slot's unique index led by the slot's time instead of the schedule, once per tick still held by it (a
second run of a recorded slot is left out, manual runs are not limited), and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, run_recorded, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BY_SCHEDULE = "uq_task_schedule_run_slot"
BY_TIME = "uq_task_schedule_run_slot_by_time"


@pytest.fixture
async def db_at_0036(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0036") as db:
        yield db


async def _runs_of_two_slots_and_a_manual_one(db: Database) -> uuid.UUID:
    """A schedule with the runs of two slots and a manual run, as release 0036 recorded them: its id."""
    schedule = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule).values(schedule_row(schedule, "nightly", T0)))
        for n, slot in enumerate((T0, T0 + timedelta(hours=1), None)):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=uuid.uuid4(),
                    schedule_id=schedule,
                    fired_at=T0 + timedelta(hours=n, seconds=1),
                    scheduled_for=slot,
                    trigger="dispatch" if slot else "manual",
                    state="completed",
                    outcomes=[],
                )
            )
    return schedule


def _slot_indexes(conn: Connection) -> dict[str, list[str | None]]:
    return {
        index["name"]: index["column_names"]
        for index in inspect(conn).get_indexes("task_schedule_run")
        if index["name"] in (BY_SCHEDULE, BY_TIME) and index["unique"]
    }


async def _recorded(db: Database, schedule: uuid.UUID, slot: datetime | None) -> bool:
    return await run_recorded(db, schedule, T0 + timedelta(days=1), slot)


async def test_the_slot_index_is_led_by_time_and_still_holds_once_per_tick_and_back_down(
    db_at_0036: Database,
) -> None:
    db = db_at_0036
    schedule = await _runs_of_two_slots_and_a_manual_one(db)
    before = await table_counts(db)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_slot_indexes) == {BY_SCHEDULE: ["schedule_id", "scheduled_for"]}

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_slot_indexes) == {BY_TIME: ["scheduled_for", "schedule_id"]}
    assert not await _recorded(db, schedule, T0), "a slot recorded before the upgrade was fired again"
    assert await _recorded(db, schedule, T0 + timedelta(hours=2))
    assert not await _recorded(db, schedule, T0 + timedelta(hours=2)), "a slot was fired twice"
    assert await _recorded(db, schedule, None) and await _recorded(db, schedule, None)

    await downgrade(db, "0036")
    assert await current_revision(db) == "0036"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_slot_indexes) == {BY_SCHEDULE: ["schedule_id", "scheduled_for"]}
    assert not await _recorded(db, schedule, T0 + timedelta(hours=2))
    assert await _recorded(db, schedule, T0 + timedelta(hours=3))
