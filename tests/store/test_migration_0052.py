"""Migration 0052 on a database holding a schedule's tasks in two statuses, on both databases: every task
kept, the list by schedule and status read back; the index of a schedule's tasks replaced by one under
its new name, which on PostgreSQL carries the status (INCLUDE) and is valid, the old one gone (0058
replaces it again: test_migration_0058.py); a run cut short (the new one left invalid, the old one still
there) finished by running it again; and back down again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rackflow.domain.tasks import TaskStatus
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from tests.conftest import database_at, downgrade, table_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schedule_task_lists import listed, made_tasks, schedule_indexes

pytestmark = pytest.mark.asyncio

OLD = "ix_tasks_schedule_id_created_at_id"
NEW = "ix_tasks_schedule_id_created_at_id_status"


@pytest.fixture
async def db_at_0051(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0051") as db:
        yield db


async def test_tasks_are_kept_and_listed_by_schedule_and_status_and_back_down(db_at_0051: Database) -> None:
    db = db_at_0051
    schedule, made = await made_tasks(db)
    before = await table_counts(db)

    assert await migrate(db, "0052") == "0052"
    assert await table_counts(db) == before  # 0052 makes no table
    for status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        assert await listed(db, schedule, status) == made[status.value]
    columns = ["schedule_id", "created_at", "id"]
    async with db.engine.connect() as conn:
        assert await conn.run_sync(schedule_indexes) == {
            NEW: columns + (["+status"] if db.is_postgres else [])
        }
    if db.is_postgres:
        assert await index_valid(db, NEW) is True

    await downgrade(db, "0051")
    assert await current_revision(db) == "0051"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(schedule_indexes) == {OLD: columns}
    assert (await table_counts(db))["tasks"] == 6


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_run_cut_short_is_finished_by_running_it_again(db_at_0051: Database) -> None:
    """As a killed migration leaves it: the new index built but invalid, the old one not yet dropped.
    Migrating again builds the new one anew and drops the old."""
    db = db_at_0051
    schedule, made = await made_tasks(db)
    await leave_an_invalid_build(db, NEW, "tasks", "schedule_id")

    assert await migrate(db, "0052") == "0052"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(schedule_indexes) == {NEW: ["schedule_id", "created_at", "id", "+status"]}
    assert await index_valid(db, NEW) is True
    assert await listed(db, schedule, TaskStatus.FAILED) == made["failed"]
