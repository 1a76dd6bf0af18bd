"""Migration 0063 on a database holding tasks as release 0062 wrote them, on both databases. PostgreSQL: the
weeks holding a task created after the week ended are found and written, the partition before the weeks as
the week of long ago; from then on the trigger writes them, for every writer, keeping each week's latest
creation; a task created within its week writes nothing; back down again, and up a second time; after
writes that skipped the trigger (a bulk load), `find_late_weeks` records their weeks. SQLite: the table,
empty."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select, text

from rackflow.ids import id_at_time
from rackflow.store import task_partitions
from rackflow.store.audit_partitions import PERIOD, period_start
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import racks, task_late_weeks, tasks
from tests.conftest import database_at, downgrade, task_row
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

RACK = uuid.uuid4()
NOW = datetime.now(UTC)
THIS_WEEK = period_start(NOW)


@pytest.fixture
async def db_at_0062(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0062") as db:
        async with db.transaction() as conn:
            await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=NOW))
        yield db


def _task(task_id: uuid.UUID, created_at: datetime) -> dict[str, object]:
    return task_row(task_id, RACK, created_at, filed_at=task_partitions.filed_at(task_id))


async def _write(db: Database, *rows: dict[str, object]) -> None:
    async with db.transaction() as conn:
        await conn.execute(insert(tasks), list(rows))


async def _late_weeks(db: Database) -> dict[datetime, datetime]:
    async with db.read() as conn:
        return {row.week: row.last_created_at for row in await conn.execute(select(task_late_weeks))}


async def test_the_weeks_of_tasks_created_late_are_found_then_kept_by_the_trigger(
    db_at_0062: Database,
) -> None:
    db = db_at_0062
    next_week = THIS_WEEK + PERIOD  # within the weeks on a database this new (BOUND is this Monday)
    old = uuid.uuid4()  # filed long ago, in the partition before the weeks
    wave = id_at_time(next_week + timedelta(hours=1))  # a rollout's later wave, created a week later
    on_time = id_at_time(next_week + timedelta(hours=2))
    await _write(
        db,
        _task(old, NOW - timedelta(days=3)),
        _task(wave, next_week + PERIOD + timedelta(hours=5)),
        _task(on_time, next_week + timedelta(hours=2)),
    )

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    if not db.is_postgres:
        assert await _late_weeks(db) == {}
        return
    assert await _late_weeks(db) == {
        task_partitions.LONG_AGO: NOW - timedelta(days=3),
        next_week: next_week + PERIOD + timedelta(hours=5),
    }

    # By hand, as any writer: a later creation in a week raises its row, an earlier one leaves it, a task
    # created within its week writes none, and a week's first late task writes its row.
    two_weeks_ago = THIS_WEEK - 2 * PERIOD
    await _write(
        db,
        _task(id_at_time(next_week + timedelta(hours=3)), next_week + PERIOD + timedelta(hours=9)),
        _task(id_at_time(next_week + timedelta(hours=4)), next_week + PERIOD + timedelta(hours=1)),
        _task(id_at_time(THIS_WEEK + timedelta(hours=1)), THIS_WEEK + timedelta(days=6, hours=23)),
        _task(id_at_time(two_weeks_ago + timedelta(days=6, hours=23)), THIS_WEEK + timedelta(seconds=1)),
    )
    assert await _late_weeks(db) == {
        task_partitions.LONG_AGO: NOW - timedelta(days=3),
        next_week: next_week + PERIOD + timedelta(hours=9),
        two_weeks_ago: THIS_WEEK + timedelta(seconds=1),
    }

    await downgrade(db, "0062")
    assert await current_revision(db) == "0062"
    async with db.read() as conn:
        found = await conn.scalar(text("SELECT count(*) FROM pg_trigger WHERE tgname = 'task_created_late'"))
    assert found == 0
    assert await migrate(db) == head_revision()  # up again: found again, the partition before as one
    assert set(await _late_weeks(db)) == {task_partitions.LONG_AGO, next_week}
    assert await schema_diff(db) == []


async def test_the_weeks_of_late_tasks_written_without_the_trigger_are_found_after(
    db_at_0062: Database,
) -> None:
    """`bench/scale_load.py` loads tasks as a replica, which skips the trigger as it skips the foreign keys'
    checks; `find_late_weeks` after it records the weeks the trigger would have, and lowers none."""
    db = db_at_0062
    assert await migrate(db) == head_revision()
    next_week = THIS_WEEK + PERIOD
    await _write(
        db, _task(id_at_time(next_week + timedelta(hours=1)), next_week + PERIOD + timedelta(hours=9))
    )
    async with db.transaction() as conn:
        if db.is_postgres:
            await conn.execute(text("SET LOCAL session_replication_role = replica"))
        await conn.execute(
            insert(tasks),
            [
                _task(id_at_time(next_week + timedelta(hours=2)), next_week + PERIOD + timedelta(hours=5)),
                _task(id_at_time(THIS_WEEK + timedelta(hours=1)), THIS_WEEK + PERIOD + timedelta(hours=1)),
                _task(id_at_time(THIS_WEEK + timedelta(hours=2)), THIS_WEEK + timedelta(hours=3)),
            ],
        )
    by_trigger = {next_week: next_week + PERIOD + timedelta(hours=9)}
    assert await _late_weeks(db) == (by_trigger if db.is_postgres else {})

    async with db.transaction() as conn:
        await conn.run_sync(task_partitions.find_late_weeks)
    found = {**by_trigger, THIS_WEEK: THIS_WEEK + PERIOD + timedelta(hours=1)}
    assert await _late_weeks(db) == (found if db.is_postgres else {})
