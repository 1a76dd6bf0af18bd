"""Migration 0057 on both databases: on PostgreSQL new pages of `tasks` are filled to 70 %, so the progress
rewrite of a task on a rack of 36 components (a row of about 1.75 KB) stays on its page, where at 90 % it
moved to another page and wrote an entry in each index of `tasks` (docs/CAPACITY.md); back down, 90 % again.
SQLite has no such setting: its schema and rows are as before."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, text, update

from rackflow.store.db import Database
from rackflow.store.migrate import head_revision, migrate
from rackflow.store.tables import racks, tasks
from tests.conftest import database_at, downgrade, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
NVL72_COMPONENTS = 36
POWER_ON = {
    "kind": "power_on",
    "forced": False,
    "window_end": None,
    "window_start": None,
    "target_version": "",
}


@pytest.fixture
async def db_at_0056(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0056") as db:
        yield db


async def _wide_tasks(db: Database, count: int) -> list[uuid.UUID]:
    """`count` running tasks on a rack each, each naming 36 components, inserted together (one page's worth
    and more, in insertion order)."""
    ids = [uuid.uuid4() for _ in range(count)]
    async with db.transaction() as conn:
        for task_id in ids:
            rack = uuid.uuid4()
            await conn.execute(insert(racks).values(id=rack, name=f"r-{rack}", created_at=T0))
            # A run's id names no run on PostgreSQL (no foreign key since 0036); SQLite's key needs a run.
            run_id = uuid.uuid4() if db.dialect == "postgresql" else None
            row = task_row(task_id, rack, T0, schedule_id=uuid.uuid4(), run_id=run_id) | {
                # as a dispatched power-on's row is written (about 1.75 KB)
                "operation": "power_on",
                "parameters": POWER_ON,
                "component_ids": [str(uuid.uuid4()) for _ in range(NVL72_COMPONENTS)],
                "description": "nightly-power-on — 2026-12-06T12:00:00.000000Z",
                "status": "running",
            }
            await conn.execute(insert(tasks).values(**row))
    return ids


async def _page_of(db: Database, task_id: uuid.UUID) -> int:
    async with db.read() as conn:
        stmt = text("SELECT (ctid::text::point)[0]::int FROM tasks WHERE id = :id")
        return int((await conn.execute(stmt, {"id": task_id})).scalar_one())


async def _progress_rewrite_moves(db: Database, task_id: uuid.UUID) -> bool:
    """Whether a progress rewrite of the task (its message, as each step writes it) left its page."""
    before = await _page_of(db, task_id)
    async with db.transaction() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == task_id).values(message="power_on: c1 (1/36)"))
    return await _page_of(db, task_id) != before


async def _fillfactor(db: Database) -> str | None:
    """The table's fillfactor setting (`fillfactor=N`), of its storage parameters (0061 adds others)."""
    async with db.read() as conn:
        stmt = text(  # from 0062 on the partitions' (the one before the weeks holds these tasks)
            "SELECT array_to_string(reloptions, ',') FROM pg_class"
            " WHERE oid = coalesce(to_regclass('tasks_before'), 'tasks'::regclass)"
        )
        options: str = (await conn.execute(stmt)).scalar_one()
    return next((o for o in options.split(",") if o.startswith("fillfactor=")), None)


async def test_a_wide_task_s_progress_rewrite_stays_on_its_page_and_back_down(db_at_0056: Database) -> None:
    db = db_at_0056
    postgres = db.dialect == "postgresql"
    before_ids = await _wide_tasks(db, 5)
    if postgres:
        assert await _progress_rewrite_moves(db, before_ids[0])  # no room on a page filled to 90 %
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []  # storage parameters included: fillfactor 70 on PostgreSQL
    assert await table_counts(db) == upgraded_counts(before)
    if postgres:
        assert await _fillfactor(db) == "fillfactor=70"
        after_ids = await _wide_tasks(db, 5)  # onto new pages, filled to 70 %
        assert not await _progress_rewrite_moves(db, after_ids[0])

    await downgrade(db, "0056")
    if postgres:
        assert await _fillfactor(db) == "fillfactor=90"
