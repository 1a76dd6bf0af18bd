"""Migration 0045 on a database holding tasks, on both databases: every task kept with no refusal (one
its gates refused under the previous release is not known so, and a takeover runs it as that release did);
a task the previous release inserts (which names no `refusal`) still taken; a refusal recorded and read
back with its task; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, insert, inspect, select

from rackflow.domain.tasks import Fail, TaskStatus
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import racks, tasks
from rackflow.store.tasks import task_from_row
from tests.conftest import database_at, downgrade, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
RACK = uuid.uuid4()


@pytest.fixture
async def db_at_0044(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0044") as db:
        yield db


def _columns(conn: Connection) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns("tasks")}


async def test_tasks_are_kept_unrefused_a_refusal_is_read_back_and_back_down(db_at_0044: Database) -> None:
    db = db_at_0044
    old, recent = uuid.uuid4(), uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(insert(tasks).values(task_row(old, RACK, T0, status="running")))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    refusal = Fail("its rollout was cancelled before it began", ends_as=TaskStatus.TERMINATED)
    async with db.transaction() as conn:
        await conn.execute(insert(tasks).values(task_row(recent, RACK, T0)))  # the previous release's insert
        await task_runs.record_refusals(conn, {recent: refusal})
    async with db.read() as conn:
        found = {row.id: task_from_row(row) for row in await conn.execute(select(tasks))}
    assert {task_id: task.refusal for task_id, task in found.items()} == {old: None, recent: refusal}

    await downgrade(db, "0044")
    assert await current_revision(db) == "0044"
    async with db.engine.connect() as conn:
        assert "refusal" not in await conn.run_sync(_columns)
    assert (await table_counts(db))["tasks"] == 2
