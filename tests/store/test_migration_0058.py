"""Migration 0058 on a database holding a schedule's tasks in two statuses, on both databases: every task
kept, the list by schedule and status read back, and the schedule's whole list; the index of a schedule's
tasks replaced by one keyed by status before the list's order, valid on PostgreSQL, the old one (which
carried the status beside its key there) gone; a run cut short (the new one left invalid, the old one
still there) finished by running it again; and back down again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rackflow.domain.tasks import TaskStatus
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schedule_task_lists import listed, made_tasks, schedule_indexes
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

OLD = "ix_tasks_schedule_id_created_at_id_status"
NEW = "ix_tasks_schedule_id_status_created_at_id"
KEYED = ["schedule_id", "status", "created_at", "id"]


@pytest.fixture
async def db_at_0057(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0057") as db:
        yield db


async def test_tasks_are_kept_and_listed_by_schedule_and_status_and_back_down(db_at_0057: Database) -> None:
    db = db_at_0057
    schedule, made = await made_tasks(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    for status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        assert await listed(db, schedule, status) == made[status.value]
    assert await listed(db, schedule) == made["every"]
    async with db.engine.connect() as conn:
        assert await conn.run_sync(schedule_indexes) == {NEW: KEYED}
    if db.is_postgres:
        assert await index_valid(db, NEW) is True

    await downgrade(db, "0057")
    assert await current_revision(db) == "0057"
    async with db.engine.connect() as conn:
        carried = ["+status"] if db.is_postgres else []  # SQLite has no INCLUDE
        assert await conn.run_sync(schedule_indexes) == {OLD: ["schedule_id", "created_at", "id", *carried]}
    assert (await table_counts(db))["tasks"] == 6


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_run_cut_short_is_finished_by_running_it_again(db_at_0057: Database) -> None:
    """As a killed migration leaves it: the new index built but invalid, the old one not yet dropped.
    Migrating again builds the new one anew and drops the old."""
    db = db_at_0057
    schedule, made = await made_tasks(db)
    await leave_an_invalid_build(db, NEW, "tasks", "schedule_id")

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    async with db.engine.connect() as conn:
        assert await conn.run_sync(schedule_indexes) == {NEW: KEYED}
    assert await index_valid(db, NEW) is True
    assert await listed(db, schedule, TaskStatus.FAILED) == made["failed"]
