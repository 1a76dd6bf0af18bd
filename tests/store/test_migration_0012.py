"""Migration 0012 on a database that already holds what 0011 wrote, on both databases: every row kept,
tasks still linked to their runs (SQLite rebuilds `task_schedule_run`, which must not unlink them), and the
new states and the one-live-rollout index in force afterwards; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import racks, task_schedule, task_schedule_run, tasks
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RACK, SCHEDULE, TASK = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
RUN_A, RUN_B = uuid.uuid4(), uuid.uuid4()
RUN_COLUMNS = ("id", "schedule_id", "fired_at", "scheduled_for", "trigger", "state", "outcomes", "owner_id")


@pytest.fixture
async def db_at_0011(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0011") as db:
        yield db


def _run(run_id: uuid.UUID, fired: datetime, state: str) -> dict[str, Any]:
    outcomes = [
        {"scope_id": str(uuid.uuid4()), "rack_id": str(RACK), "outcome": "submitted", "task_id": None}
    ]
    return {
        "id": run_id,
        "schedule_id": SCHEDULE,
        "fired_at": fired,
        "scheduled_for": fired,
        "trigger": "dispatch",
        "state": state,
        "outcomes": outcomes,
    }


async def _write_as_0011(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(task_schedule).values(
                id=SCHEDULE,
                name="nightly",
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                created_at=T0,
                updated_at=T0,
            )
        )
        await conn.execute(
            insert(task_schedule_run),
            [_run(RUN_A, T0, "completed"), _run(RUN_B, T0 + timedelta(hours=1), "running")],
        )
        await conn.execute(
            insert(tasks).values(
                id=TASK,
                operation="power_off",
                parameters={"kind": "power_off", "forced": False},
                rack_id=RACK,
                component_ids=[],
                status="completed",
                created_at=T0,
                updated_at=T0,
                schedule_id=SCHEDULE,
                run_id=RUN_A,
            )
        )


async def _runs(db: Database) -> list[tuple[Any, ...]]:
    columns = [task_schedule_run.c[name] for name in RUN_COLUMNS]
    async with db.read() as conn:
        return sorted((await conn.execute(select(*columns))).all(), key=str)


async def test_upgrade_keeps_every_run_and_task_link_then_holds_one_live_rollout(
    db_at_0011: Database,
) -> None:
    db = db_at_0011
    await _write_as_0011(db)
    counts = upgraded_counts(await table_counts(db))
    runs_before = await _runs(db)

    assert await migrate(db) == head_revision() == await current_revision(db)

    assert await table_counts(db) == counts
    assert await _runs(db) == runs_before
    async with db.read() as conn:
        assert (await conn.execute(select(tasks.c.run_id).where(tasks.c.id == TASK))).scalar_one() == RUN_A
        new = (
            await conn.execute(select(task_schedule_run.c.reason, task_schedule_run.c.failures_excused))
        ).all()
        assert set(new) == {("", 0)}
        assert (await conn.execute(select(task_schedule.c.rollout))).scalar_one() is None

    async with db.transaction() as conn:  # the new states are allowed, one live rollout per schedule
        await conn.execute(
            update(task_schedule_run).where(task_schedule_run.c.id == RUN_A).values(state="halted")
        )
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(
                update(task_schedule_run).where(task_schedule_run.c.id == RUN_B).values(state="rolling")
            )
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(
                update(task_schedule_run).where(task_schedule_run.c.id == RUN_B).values(state="exploded")
            )


async def test_downgrade_ends_rollout_runs_and_keeps_the_links(db_at_0011: Database) -> None:
    db = db_at_0011
    await _write_as_0011(db)
    await migrate(db)
    async with db.transaction() as conn:
        await conn.execute(
            update(task_schedule_run).where(task_schedule_run.c.id == RUN_B).values(state="rolling")
        )
    await downgrade(db, "0011")
    assert await current_revision(db) == "0011"
    async with db.read() as conn:
        states = dict((await conn.execute(select(task_schedule_run.c.id, task_schedule_run.c.state))).all())
        assert (await conn.execute(select(tasks.c.run_id).where(tasks.c.id == TASK))).scalar_one() == RUN_A
    assert states == {RUN_A: "completed", RUN_B: "interrupted"}
