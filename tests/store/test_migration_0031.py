"""Migration 0031 on a database with schedules and runs, on both databases: every existing schedule is
stamped (`task_schedule.scope_removed_after`) at the migration's time, or its newest run's `fired_at` if
that is later (a run fired by a clock ahead), so the runs grid reads the racks that left for every run
fired before the migration; a schedule created after it has none; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Insert, insert, inspect, select

from rackflow.store import scope_removals
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade
from tests.store.schedules_support import make_env
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
AHEAD = datetime.now(UTC) + timedelta(days=400)  # a run fired by a clock far ahead


@pytest.fixture
async def db_at_0030(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0030") as db:
        yield db


async def _schedule(db: Database, name: str) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(_old_schedule_insert(schedule_id, name))
    return schedule_id


def _old_schedule_insert(schedule_id: uuid.UUID, name: str) -> Insert:
    """A schedule as the previous release inserts it (no stamp column)."""
    columns = {
        "id": schedule_id,
        "name": name,
        "spec_type": "interval",
        "spec": "1h",
        "operation_template": {"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
        "enabled": True,
        "created_at": T0,
        "updated_at": T0,
    }
    return insert(task_schedule).values(columns)


async def _run(db: Database, schedule_id: uuid.UUID, fired_at: datetime) -> uuid.UUID:
    run_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule_run).values(
                id=run_id,
                schedule_id=schedule_id,
                fired_at=fired_at,
                trigger="manual",
                state="completed",
                outcomes=[],
            )
        )
    return run_id


async def _stamps(db: Database) -> dict[uuid.UUID, datetime | None]:
    async with db.read() as conn:
        stmt = select(task_schedule.c.id, task_schedule.c.scope_removed_after)
        return {row.id: row.scope_removed_after for row in await conn.execute(stmt)}


def _columns(conn: Connection) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns("task_schedule")}


@pytest.mark.parametrize("ahead", [False, True], ids=["now", "a-run-ahead"])
async def test_existing_schedules_are_stamped_new_ones_are_not_and_downgrade_drops_it(
    db_at_0030: Database, ahead: bool
) -> None:
    """One constant for every existing schedule (the column's default, kept in the catalogue): the
    migration's time, or the newest `fired_at` of all runs when a clock ahead fired one (every schedule's
    grid then reads who left until its runs fire after that)."""
    db = db_at_0030
    idle = await _schedule(db, "idle")
    fired = await _schedule(db, "fired")
    early = await _run(db, fired, T0)
    if ahead:
        await _run(db, fired, AHEAD)
    # The migration's database statement and this clock agree to well within a minute.
    started = datetime.now(UTC) - timedelta(minutes=1)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    stamps = await _stamps(db)
    stamp = stamps[idle]
    assert stamps == {idle: stamp, fired: stamp}
    if ahead:
        assert stamp == AHEAD
    else:
        assert stamp is not None and started <= stamp <= datetime.now(UTC) + timedelta(minutes=1)
    async with db.read() as conn:
        assert await scope_removals.may_have_left(conn, fired, [early])  # fired before the migration

    # A schedule the current release creates has no stamp (`insert_schedule` writes NULL). One the
    # previous release inserts meanwhile has none on PostgreSQL (the default is dropped), and the
    # migration's on SQLite (its default stays), which is as sound: it is older than the schedule's runs.
    env = make_env(db)
    created = await env.schedule("created", racks=[await env.rack("r1")])
    old = await _schedule(db, "old")
    stamps = await _stamps(db)
    assert stamps[created.id] is None
    assert stamps[old] == (None if db.is_postgres else stamp)

    await downgrade(db, "0030")
    assert await current_revision(db) == "0030"
    async with db.engine.connect() as conn:
        assert "scope_removed_after" not in await conn.run_sync(_columns)
