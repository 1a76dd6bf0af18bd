"""The migrations create exactly the tables of rackflow.store.tables, on both databases."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy import insert, select

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, require_migrated
from rackflow.store.tables import instances
from tests.store.schema_diff import schema_diff


async def test_migrated_schema_matches_tables(db: Database) -> None:
    assert await current_revision(db) == head_revision()
    await require_migrated(db)

    assert await schema_diff(db) == []


async def test_utc_times_round_trip_exactly(db: Database) -> None:
    """SQLite drops offsets; the UTCDateTime type must hand back the same instant, aware, in UTC."""
    stamp = datetime(2026, 3, 8, 2, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5)))
    async with db.transaction() as conn:
        await conn.execute(
            insert(instances).values(id=uuid.uuid4(), host="h", pid=1, started_at=stamp, heartbeat_at=stamp)
        )
    async with db.read() as conn:
        got = (await conn.execute(select(instances.c.started_at))).scalar_one()
    assert got == stamp
    assert got.tzinfo == UTC
    assert got.microsecond == 123456
