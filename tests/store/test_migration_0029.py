"""Migration 0029 on a database that already holds failing-streak marks, on both databases: a row per mark
(`seq`), the marks kept; the previous release's mark and take, as it sends them, still work on the new
table while it serves; and back down again, one row per schedule.

The previous release's statements are built here as its `store.streak_checks` built them, from a table of
the old shape (key `schedule_id`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Column, Connection, ForeignKey, MetaData, Table, Uuid, delete, insert, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store import streak_checks
from rackflow.store.db import Database
from rackflow.store.dialect import insert_new
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import failing_streak_checks, task_schedule
from tests.conftest import database_at, downgrade
from tests.store.schema_diff import schema_diff

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

# The table as the previous release (0023 to 0028) declares it.
_old = MetaData()
Table("task_schedule", _old, Column("id", Uuid, primary_key=True))
old_checks = Table(
    "failing_streak_checks",
    _old,
    Column("schedule_id", Uuid, ForeignKey("task_schedule.id", ondelete="CASCADE"), primary_key=True),
)


async def old_mark(conn: AsyncConnection, schedule_ids: list[uuid.UUID]) -> None:
    """The previous release's `_mark`: INSERT … SELECT … ON CONFLICT DO NOTHING, in id order."""
    owner = task_schedule.c
    pausing = (
        select(owner.id)
        .where(owner.id.in_(schedule_ids), owner.pause_after_failed_runs > 0, owner.enabled.is_(True))
        .order_by(owner.id)
    )
    await conn.execute(insert_new(conn.dialect.name, old_checks).from_select(["schedule_id"], pausing))


async def old_take(db: Database, conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
    """The previous release's `take_marked`."""
    marked = db.skip_locked(select(old_checks.c.schedule_id).order_by(old_checks.c.schedule_id).limit(limit))
    stmt = (
        delete(old_checks)
        .where(old_checks.c.schedule_id.in_(marked.scalar_subquery()))
        .returning(old_checks.c.schedule_id)
    )
    return list((await conn.execute(stmt)).scalars())


@pytest.fixture
async def db_at_0028(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0028") as db:
        yield db


async def _schedule(db: Database, name: str) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule).values(
                id=schedule_id,
                name=name,
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                enabled=True,
                pause_after_failed_runs=3,
                created_at=T0,
                updated_at=T0,
            )
        )
    return schedule_id


async def _marks(db: Database) -> list[uuid.UUID]:
    async with db.read() as conn:
        return sorted((await conn.execute(select(old_checks.c.schedule_id))).scalars())


def _key(conn: Connection) -> list[str]:
    return list(inspect(conn).get_pk_constraint("failing_streak_checks")["constrained_columns"])


async def test_upgrade_keeps_the_marks_the_old_release_works_on_them_and_downgrade_dedupes(
    db_at_0028: Database,
) -> None:
    db = db_at_0028
    a, b, c = sorted([await _schedule(db, "a"), await _schedule(db, "b"), await _schedule(db, "c")])
    async with db.transaction() as conn:
        await old_mark(conn, [a, b])
    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await _marks(db) == [a, b]  # kept

    # The previous release, still serving: its mark adds a row even where one is (no conflict any more),
    # and the current release's adds another.
    async with db.transaction() as conn:
        await old_mark(conn, [a, c])
        await streak_checks.mark_schedules(conn, [a])
    assert await _marks(db) == [a, a, a, b, c]
    async with db.read() as conn:
        seqs = list((await conn.execute(select(failing_streak_checks.c.seq))).scalars())
    assert len(set(seqs)) == 5

    # Its take picks a's first row and deletes every visible row of a (an id per row; its look ignores
    # duplicates); the current release's take then has the others.
    async with db.transaction() as conn:
        assert await old_take(db, conn, 1) == [a, a, a]
    async with db.transaction() as conn:
        assert await streak_checks.take_marked(db, conn, 200) == [b, c]
    assert await _marks(db) == []

    # Down: one row per schedule, keyed by it again.
    async with db.transaction() as conn:
        await streak_checks.mark_schedules(conn, [a, b])
        await streak_checks.mark_schedules(conn, [a])
    assert await _marks(db) == [a, a, b]
    await downgrade(db, "0028")
    assert await current_revision(db) == "0028"
    assert await _marks(db) == [a, b]
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_key) == ["schedule_id"]
    async with db.transaction() as conn:
        await old_mark(conn, [a, c])  # a conflicts: nothing added for it
    assert await _marks(db) == [a, b, c]
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(insert(old_checks).values(schedule_id=a))


async def test_the_full_look_adds_no_row_for_a_schedule_already_marked(db_at_0028: Database) -> None:
    db = db_at_0028
    a, b = sorted([await _schedule(db, "a"), await _schedule(db, "b")])
    assert await migrate(db) == head_revision()
    async with db.transaction() as conn:
        await streak_checks.mark_schedules(conn, [a])
        await streak_checks.mark_every_schedule(conn)
        await streak_checks.mark_every_schedule(conn)
    assert await _marks(db) == [a, b]
