"""Migration 0036 on a database whose tasks name their runs, on both databases: every row and every task's
`run_id` kept; on PostgreSQL the foreign key gone, so a deleted run leaves its id in its tasks (SQLite keeps
the key, which still unlinks them); and back down again, where the ids naming no run are forgotten before
the key returns."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, delete, insert, inspect, select

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import racks, task_schedule, task_schedule_run, tasks
from tests.conftest import database_at, downgrade, schedule_row, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db_at_0035(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0035") as db:
        yield db


async def _tasks_naming_runs(db: Database, count: int) -> dict[uuid.UUID, uuid.UUID]:
    """`count` runs of one schedule, each with a task of its own: task id -> run id."""
    rack, schedule = uuid.uuid4(), uuid.uuid4()
    named: dict[uuid.UUID, uuid.UUID] = {}
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        await conn.execute(insert(task_schedule).values(**schedule_row(schedule, "s1", T0)))
        for _ in range(count):
            run, task = uuid.uuid4(), uuid.uuid4()
            await conn.execute(
                insert(task_schedule_run).values(
                    id=run,
                    schedule_id=schedule,
                    fired_at=T0,
                    trigger="manual",
                    state="completed",
                    outcomes=[],
                )
            )
            await conn.execute(
                insert(tasks).values(**task_row(task, rack, T0, schedule_id=schedule, run_id=run))
            )
            named[task] = run
    return named


async def _task_runs(db: Database) -> dict[uuid.UUID, uuid.UUID | None]:
    async with db.read() as conn:
        return {row.id: row.run_id for row in await conn.execute(select(tasks.c.id, tasks.c.run_id))}


def _run_keys(conn: Connection) -> list[list[str]]:
    keys = inspect(conn).get_foreign_keys("tasks")
    return [key["constrained_columns"] for key in keys if key["constrained_columns"] == ["run_id"]]


async def test_tasks_keep_their_run_ids_without_the_key_and_back_down(db_at_0035: Database) -> None:
    db = db_at_0035
    named = await _tasks_naming_runs(db, 3)
    before = await table_counts(db)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_run_keys) == [["run_id"]]

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _task_runs(db) == named
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_run_keys) == ([] if db.is_postgres else [["run_id"]])

    # A pruned run: on PostgreSQL its tasks keep its id (no key unlinks them); SQLite's key unlinks them.
    pruned_task, pruned_run = next(iter(named.items()))
    async with db.transaction() as conn:
        await conn.execute(delete(task_schedule_run).where(task_schedule_run.c.id == pruned_run))
    unlinked = {**named, pruned_task: None}
    assert await _task_runs(db) == (named if db.is_postgres else unlinked)

    # Down again: the id naming no run is forgotten, the others kept, the key back.
    await downgrade(db, "0035")
    assert await current_revision(db) == "0035"
    assert await _task_runs(db) == unlinked
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_run_keys) == [["run_id"]]
