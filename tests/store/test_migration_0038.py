"""Migration 0038 on a database holding schedules with runs, on both databases: every row kept, each
schedule's run count not known (NULL) until counted at its next firing, a schedule created afterwards
counted from 0, and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect, select

from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db_at_0037(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0037") as db:
        yield db


async def _schedule_with_runs(db: Database, name: str, runs: int) -> uuid.UUID:
    """A schedule with `runs` completed runs, as release 0037 recorded them: its id."""
    schedule = uuid.uuid4()
    async with db.transaction() as conn:
        template = {"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600}  # as 0037 wrote it
        row = schedule_row(schedule, name, T0) | {"operation_template": template}
        await conn.execute(insert(task_schedule).values(row))
        for n in range(runs):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=uuid.uuid4(),
                    schedule_id=schedule,
                    fired_at=T0 + timedelta(hours=n),
                    scheduled_for=T0 + timedelta(hours=n),
                    trigger="dispatch",
                    state="completed",
                    outcomes=[],
                )
            )
    return schedule


def _columns(conn: Connection) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns("task_schedule")}


async def _counts(db: Database) -> dict[uuid.UUID, int | None]:
    async with db.read() as conn:
        rows = await conn.execute(select(task_schedule.c.id, task_schedule.c.run_count))
        return {row.id: row.run_count for row in rows}


async def test_run_counts_start_unknown_are_counted_at_a_firing_and_back_down(db_at_0037: Database) -> None:
    db = db_at_0037
    three, none = await _schedule_with_runs(db, "three", 3), await _schedule_with_runs(db, "none", 0)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _counts(db) == {three: None, none: None}
    # What a firing's write-back does for the schedules it fired (`cap_runs`), each as it was claimed.
    async with db.transaction() as conn:
        claimed = [await store.get_schedule(conn, three), await store.get_schedule(conn, none)]
        assert [s.run_count for s in claimed if s is not None] == [None, None]
        await run_history.cap_runs(conn, [s for s in claimed if s is not None])
    assert await _counts(db) == {three: 3, none: 0}

    await downgrade(db, "0037")
    assert await current_revision(db) == "0037"
    async with db.engine.connect() as conn:
        assert "run_count" not in await conn.run_sync(_columns)
    assert await table_counts(db) == before
