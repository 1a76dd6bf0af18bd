"""Migration 0061 on both databases: on PostgreSQL `tasks` is vacuumed once 10,000 rows and one per cent
of it are dead, its indexes cleaned every time (the executor's claim reads the pages of every task ended
since the last VACUUM: docs/PERFORMANCE.md), its other storage parameters kept; back down, autovacuum's
defaults again. SQLite has no such settings: its schema and rows are as before."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from rackflow.store.db import Database
from rackflow.store.migrate import head_revision, migrate
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

VACUUMED_OFTEN = {
    "vacuum_index_cleanup=on",
    "autovacuum_vacuum_scale_factor=0.01",
    "autovacuum_vacuum_threshold=10000",
}


@pytest.fixture
async def db_at_0060(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0060") as db:
        yield db


async def _storage(db: Database) -> set[str]:
    async with db.read() as conn:
        # From 0062 on the partitions hold the storage, the one before the weeks among them.
        stmt = text(
            "SELECT reloptions FROM pg_class"
            " WHERE oid = coalesce(to_regclass('tasks_before'), 'tasks'::regclass)"
        )
        return set((await conn.execute(stmt)).scalar_one() or [])


async def test_tasks_are_vacuumed_often_and_back_down(db_at_0060: Database) -> None:
    db = db_at_0060
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []  # storage parameters included on PostgreSQL
    assert await table_counts(db) == upgraded_counts(before)
    if db.is_postgres:
        assert await _storage(db) == {"fillfactor=70", *VACUUMED_OFTEN}

    await downgrade(db, "0060")
    if db.is_postgres:
        assert await _storage(db) == {"fillfactor=70"}
    made_later = {"task_live_weeks"}  # by 0062, gone with it
    assert await table_counts(db) == {k: v for k, v in upgraded_counts(before).items() if k not in made_later}
