"""Migration 0034 on a database whose scopes name their last tasks, on both databases: every row and every
scope's `last_task_id` kept, the foreign key and its index gone (a deleted task leaves its id in the scope),
the scope table's pages kept 10 % free on PostgreSQL; and back down again, where the ids of tasks no longer
there are forgotten before the key returns."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, delete, insert, inspect, select

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import racks, task_schedule, task_schedule_scope, tasks
from tests.conftest import database_at, downgrade, schedule_row, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
INDEX = "ix_task_schedule_scope_last_task_id"


@pytest.fixture
async def db_at_0033(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0033") as db:
        yield db


async def _scopes_naming_tasks(db: Database, count: int) -> dict[uuid.UUID, uuid.UUID]:
    """`count` schedules of one scope each, every scope naming a task of its own: scope id -> task id."""
    rack = uuid.uuid4()
    named: dict[uuid.UUID, uuid.UUID] = {}
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        for n in range(count):
            schedule, task, scope = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            await conn.execute(insert(task_schedule).values(**schedule_row(schedule, f"s{n}", T0)))
            await conn.execute(insert(tasks).values(**task_row(task, rack, T0)))
            await conn.execute(
                insert(task_schedule_scope).values(
                    id=scope, schedule_id=schedule, rack_id=rack, last_task_id=task, created_at=T0
                )
            )
            named[scope] = task
    return named


async def _last_tasks(db: Database) -> dict[uuid.UUID, uuid.UUID | None]:
    async with db.read() as conn:
        stmt = select(task_schedule_scope.c.id, task_schedule_scope.c.last_task_id)
        return {row.id: row.last_task_id for row in await conn.execute(stmt)}


def _key_and_index(conn: Connection) -> tuple[list[list[str]], set[str]]:
    inspector = inspect(conn)
    keys = [key["constrained_columns"] for key in inspector.get_foreign_keys("task_schedule_scope")]
    indexes = {index["name"] for index in inspector.get_indexes("task_schedule_scope")}
    return [columns for columns in keys if columns == ["last_task_id"]], {INDEX} & indexes


async def test_scopes_keep_their_last_tasks_without_the_key_and_back_down(db_at_0033: Database) -> None:
    db = db_at_0033
    named = await _scopes_naming_tasks(db, 3)
    before = await table_counts(db)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_key_and_index) == ([["last_task_id"]], {INDEX})

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []  # storage parameters included: fillfactor 90 on PostgreSQL
    assert await table_counts(db) == upgraded_counts(before)
    assert await _last_tasks(db) == named
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_key_and_index) == ([], set())

    # A pruned task leaves its id: no key sets it NULL now.
    pruned_scope, pruned_task = next(iter(named.items()))
    async with db.transaction() as conn:
        await conn.execute(delete(tasks).where(tasks.c.id == pruned_task))
    assert await _last_tasks(db) == named

    # Down again: the id naming no task is forgotten, the others kept, the key and index back.
    await downgrade(db, "0033")
    assert await current_revision(db) == "0033"
    assert await _last_tasks(db) == {**named, pruned_scope: None}
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_key_and_index) == ([["last_task_id"]], {INDEX})
