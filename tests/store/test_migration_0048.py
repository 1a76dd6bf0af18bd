"""Migration 0048 on a database holding tasks, on both databases: the new `window_decisions_owed` is there
and empty, every task kept; a decision owed is recorded (once, however often), read and settled once
upgraded; the downgrade drops the table and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.clock import SystemClock
from rackflow.inventory.service import InventoryService
from rackflow.store import decisions_owed
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import tasks
from tests.conftest import database_at, downgrade, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

CLOCK = SystemClock()
CAUSE = {"change": "window_updated"}  # what made it owed (migration 0050: test_migration_0050.py)


@pytest.fixture
async def db_at_0047(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0047") as db:
        yield db


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_tasks_are_kept_decisions_owed_recorded_settled_and_back_down(db_at_0047: Database) -> None:
    db = db_at_0047
    rack = await InventoryService(db, CLOCK).create_rack("r1")
    task_id = uuid.uuid4()
    async with db.transaction() as conn:  # as release 0047 inserts a task
        pending = task_row(task_id, rack.id, datetime.now(UTC), status="pending", operation="power_on")
        await conn.execute(insert(tasks).values({**pending, "parameters": {"kind": "power_on"}}))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)

    gone = uuid.uuid4()  # a task pruned since: no foreign key refuses (nor locks) it
    for _ in range(2):
        async with db.transaction() as conn:
            await decisions_owed.owe(conn, dict.fromkeys({task_id, gone}, CAUSE), datetime.now(UTC))
    async with db.read() as conn:
        assert await decisions_owed.owed(conn, 10) == sorted([task_id, gone], key=lambda i: i.int)
        assert len(await decisions_owed.owed(conn, 1)) == 1
    async with db.transaction() as conn:
        await decisions_owed.settle(conn, {task_id, gone})
    async with db.read() as conn:
        assert await decisions_owed.owed(conn, 10) == []

    await downgrade(db, "0047")
    assert await current_revision(db) == "0047"
    async with db.engine.connect() as conn:
        assert "window_decisions_owed" not in await conn.run_sync(_tables)
    assert await table_counts(db) == before
