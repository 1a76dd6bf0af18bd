"""Migration 0010 (the retention indexes) on a database that holds the previous revision's rows, on both
databases: every row kept and the two indexes there (the scopes' one until 0034 drops it;
tests/store/test_migrations.py compares the whole schema with `tables.py`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, inspect

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, scripts
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks
from tests.conftest import schedule_row, table_counts, task_row, upgraded_counts

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PREVIOUS = scripts().get_revision("0010").down_revision
assert isinstance(PREVIOUS, str)


@pytest.fixture
async def db_before(empty_db_url: str) -> AsyncIterator[Database]:
    db = Database(empty_db_url)
    assert await migrate(db, PREVIOUS) == PREVIOUS
    yield db
    await db.dispose()


async def test_0010_keeps_every_row_and_adds_the_retention_indexes(db_before: Database) -> None:
    db = db_before
    rack, schedule, task, run = (uuid.uuid4() for _ in range(4))
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        await conn.execute(insert(task_schedule).values(**schedule_row(schedule, "nightly", T0)))
        await conn.execute(
            insert(task_schedule_run).values(
                id=run, schedule_id=schedule, fired_at=T0, trigger="dispatch", state="completed", outcomes=[]
            )
        )
        await conn.execute(insert(tasks).values(**task_row(task, rack, T0, run_id=run)))
        await conn.execute(
            insert(task_schedule_scope).values(
                id=uuid.uuid4(), schedule_id=schedule, rack_id=rack, last_task_id=task, created_at=T0
            )
        )
    before = await table_counts(db)

    def index_names(conn: object, table: str) -> set[str]:
        return {ix["name"] for ix in inspect(conn).get_indexes(table)}  # type: ignore[misc]

    # The scopes' index served the foreign key that migration 0034 drops with it.
    assert await migrate(db, "0010") == "0010"
    async with db.engine.connect() as conn:
        assert "ix_task_schedule_run_fired_at_id" in await conn.run_sync(index_names, "task_schedule_run")
        assert "ix_task_schedule_scope_last_task_id" in await conn.run_sync(
            index_names, "task_schedule_scope"
        )

    assert await migrate(db) == head_revision() == await current_revision(db)

    assert await table_counts(db) == upgraded_counts(before)
