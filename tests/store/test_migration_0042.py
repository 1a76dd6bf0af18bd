"""Migration 0042 on a database holding runs, on both databases: every run kept with no `started_at`, so
the sweep counts a running one's age from its firing as before; a run the previous release inserts (which
names no `started_at`) still taken; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect, select

from rackflow.store import dispatch
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 9, 12, 0, tzinfo=UTC)
SCHEDULE = uuid.uuid4()


@pytest.fixture
async def db_at_0041(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0041") as db:
        yield db


def _run(fired_at: datetime) -> dict[str, object]:
    """A manual run's row, "running", as the release before 0042 inserts it (no `started_at`)."""
    return {
        "id": uuid.uuid4(),
        "schedule_id": SCHEDULE,
        "fired_at": fired_at,
        "trigger": "manual",
        "state": "running",
        "outcomes": [],
    }


def _columns(conn: Connection) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns("task_schedule_run")}


async def test_runs_are_kept_swept_from_their_firing_and_back_down(db_at_0041: Database) -> None:
    db = db_at_0041
    old = _run(T0 - dispatch.STUCK_RUN_AGE - timedelta(seconds=1))
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule).values(schedule_row(SCHEDULE, "nightly", T0)))
        await conn.execute(insert(task_schedule_run).values(old))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    recent = _run(T0)
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule_run).values(recent))  # the previous release's insert
        assert await dispatch.mark_abandoned_runs(conn, T0, timedelta(seconds=15)) == 1
    async with db.read() as conn:
        rows = (await conn.execute(select(task_schedule_run.c.id, task_schedule_run.c.state))).all()
        started = (await conn.execute(select(task_schedule_run.c.started_at))).scalars().all()
    assert dict(rows) == {old["id"]: "interrupted", recent["id"]: "running"}
    assert started == [None, None]

    await downgrade(db, "0041")
    assert await current_revision(db) == "0041"
    async with db.engine.connect() as conn:
        assert "started_at" not in await conn.run_sync(_columns)
    assert (await table_counts(db))["task_schedule_run"] == 2
