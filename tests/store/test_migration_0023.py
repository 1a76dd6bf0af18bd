"""Migration 0023 on a database that already holds schedules, on both databases: the failing-streak marks
(`store.streak_checks`) start with every enabled schedule that pauses after failures, so the first look
after the upgrade decides them all; and back down again, the table gone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, insert, inspect, select

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from rackflow.store.tables import failing_streak_checks, task_schedule
from tests.conftest import database_at, downgrade

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db_at_0022(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0022") as db:
        yield db


async def _schedule(db: Database, name: str, *, pause_after: int, enabled: bool) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule).values(
                id=schedule_id,
                name=name,
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                enabled=enabled,
                pause_after_failed_runs=pause_after,
                created_at=T0,
                updated_at=T0,
            )
        )
    return schedule_id


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_upgrade_marks_the_enabled_schedules_that_pause_after_failures(db_at_0022: Database) -> None:
    db = db_at_0022
    pausing = await _schedule(db, "pausing", pause_after=3, enabled=True)
    await _schedule(db, "paused", pause_after=3, enabled=False)
    await _schedule(db, "plain", pause_after=0, enabled=True)
    assert await migrate(db, "0023") == "0023"
    async with db.read() as conn:
        assert list((await conn.execute(select(failing_streak_checks.c.schedule_id))).scalars()) == [pausing]

    await downgrade(db, "0022")
    assert await current_revision(db) == "0022"
    async with db.engine.connect() as conn:
        assert "failing_streak_checks" not in await conn.run_sync(_tables)
