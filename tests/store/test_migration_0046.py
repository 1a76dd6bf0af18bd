"""Migration 0046 on a database holding dispatched, manual, rolling and awaiting runs, on both databases:
every row kept; on PostgreSQL the runs partitioned by week of their slot, the old table the DEFAULT
partition, the live runs copied into the trigger's table; once per tick, one live rollout and one awaiting
run per schedule held as before; back down again, and up a second time. A try that left its CHECK behind
is taken up again with that CHECK's bound."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect, text

from rackflow.domain.schedules import RunState
from rackflow.store import run_partitions
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, run_recorded, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LIVE_UNIQUE = {"uq_task_schedule_run_live_rollout", "uq_task_schedule_run_awaiting"}


@pytest.fixture
async def db_at_0045(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0045") as db:
        yield db


async def _history(db: Database) -> dict[str, uuid.UUID]:
    """As release 0045 recorded them: two slots and a manual run of one schedule, a rolling run of a second
    and a run awaiting approval of a third. Their ids by name."""
    ids = {name: uuid.uuid4() for name in ("plain", "rolling", "awaiting")}
    rows: list[tuple[str, datetime | None, RunState]] = [
        ("plain", T0, "completed"),
        ("plain", T0 + timedelta(hours=1), "completed"),
        ("plain", None, "completed"),
        ("rolling", T0, "rolling"),
        ("awaiting", T0, "awaiting_approval"),
    ]
    async with db.transaction() as conn:
        for name, schedule_id in ids.items():
            await conn.execute(insert(task_schedule).values(schedule_row(schedule_id, name, T0)))
        for n, (name, slot, state) in enumerate(rows):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=uuid.uuid4(),
                    schedule_id=ids[name],
                    fired_at=T0 + timedelta(minutes=n),
                    scheduled_for=slot,
                    trigger="dispatch" if slot else "manual",
                    state=state,
                    outcomes=[],
                )
            )
    return ids


async def _recorded(
    db: Database, schedule: uuid.UUID, slot: datetime | None, state: RunState = "running"
) -> bool:
    return await run_recorded(db, schedule, T0 + timedelta(days=1), slot, state)


async def _guarantees_hold(db: Database, ids: dict[str, uuid.UUID], slot: datetime) -> None:
    """Once per tick (for a slot recorded before, and for `slot`, new), manual runs unlimited, and no second
    live rollout or awaiting run of a schedule that has one."""
    assert not await _recorded(db, ids["plain"], T0), "a slot recorded before the upgrade was fired again"
    assert await _recorded(db, ids["plain"], slot)
    assert not await _recorded(db, ids["plain"], slot), "a slot was fired twice"
    assert await _recorded(db, ids["plain"], None) and await _recorded(db, ids["plain"], None)
    assert not await _recorded(db, ids["rolling"], None, "rolling"), "a second live rollout"
    assert not await _recorded(db, ids["awaiting"], None, "awaiting_approval"), (
        "a second run awaiting approval"
    )


def _shape(conn: Connection) -> tuple[str, set[str]]:
    """The runs table's kind ('r' a table, 'p' partitioned; SQLite: 'r') and its unique live-run indexes."""
    kind = "r"
    if conn.dialect.name == "postgresql":
        kind = conn.execute(
            text("SELECT relkind::text FROM pg_class WHERE oid = 'task_schedule_run'::regclass")
        ).scalar_one()
    unique = {i["name"] for i in inspect(conn).get_indexes("task_schedule_run") if i["unique"]}
    return kind, unique & LIVE_UNIQUE


async def test_the_runs_are_partitioned_with_every_guarantee_and_back_down(db_at_0045: Database) -> None:
    db = db_at_0045
    ids = await _history(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_shape) == (("p", set()) if db.is_postgres else ("r", LIVE_UNIQUE))
    if db.is_postgres:
        async with db.read() as conn:
            homes = set(
                (
                    await conn.execute(
                        text("SELECT DISTINCT tableoid::regclass::text FROM task_schedule_run")
                    )
                ).scalars()
            )
            live = {
                (row.schedule_id, row.kind)
                for row in await conn.execute(text(f"SELECT schedule_id, kind FROM {run_partitions.LIVE}"))
            }
        assert homes == {run_partitions.DEFAULT_PARTITION}
        assert live == {(ids["rolling"], "rollout"), (ids["awaiting"], "approval")}
    await _guarantees_hold(db, ids, T0 + timedelta(hours=5))

    after_upgrade = await table_counts(db)
    await downgrade(db, "0045")
    assert await current_revision(db) == "0045"
    assert await table_counts(db) == {k: v for k, v in after_upgrade.items() if k in before}
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_shape) == ("r", LIVE_UNIQUE)
    assert not await _recorded(db, ids["rolling"], None, "rolling")

    assert await migrate(db) == head_revision()  # up again, on the table the downgrade made
    assert await schema_diff(db) == []
    await _guarantees_hold(db, ids, T0 + timedelta(hours=6))


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_check_left_by_an_earlier_try_is_taken_up_with_its_bound(db_at_0045: Database) -> None:
    """Should the migration fail after its CHECK committed (on its own connection), the older release goes on
    firing slots before the bound; the retry takes the CHECK it finds, and the weeks start at its bound."""
    db = db_at_0045
    await _history(db)
    bound = datetime(2027, 3, 1, tzinfo=UTC)  # a Monday
    async with db.transaction() as conn:
        await conn.execute(
            text(
                f"ALTER TABLE task_schedule_run ADD CONSTRAINT {run_partitions.BEFORE}"
                f" CHECK (scheduled_for IS NULL OR scheduled_for < '{bound.isoformat()}') NOT VALID"
            )
        )
    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    async with db.read() as conn:
        weeks = await conn.run_sync(run_partitions.weeks)
    assert weeks[0].lower == bound
