"""Migration 0019 on a database that already holds what 0018 wrote, on both databases: every run kept and
still linked to its tasks (SQLite rebuilds `task_schedule_run`), schedules without a deadline of their own
(the server's default applies) and never pausing after failures, and the "missed" state allowed; and back
down again, a missed run read as a completed one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from rackflow.store.tables import racks, task_schedule, task_schedule_run, tasks
from tests.conftest import database_at, downgrade, table_counts

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RACK, SCHEDULE, TASK, RUN = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


@pytest.fixture
async def db_at_0018(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0018") as db:
        yield db


async def _write_as_0018(db: Database) -> None:
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
        outcomes = [
            {"scope_id": str(uuid.uuid4()), "rack_id": str(RACK), "outcome": "submitted", "task_id": None}
        ]
        await conn.execute(
            insert(task_schedule_run).values(
                id=RUN,
                schedule_id=SCHEDULE,
                fired_at=T0,
                scheduled_for=T0,
                trigger="dispatch",
                state="completed",
                outcomes=outcomes,
            )
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
                run_id=RUN,
            )
        )


async def test_upgrade_keeps_runs_and_links_and_allows_missed(db_at_0018: Database) -> None:
    db = db_at_0018
    await _write_as_0018(db)
    counts = await table_counts(db)

    assert await migrate(db, "0019") == "0019" == await current_revision(db)

    assert await table_counts(db) == counts
    schedule, run = task_schedule.c, task_schedule_run.c
    async with db.read() as conn:
        assert (await conn.execute(select(tasks.c.run_id).where(tasks.c.id == TASK))).scalar_one() == RUN
        safety = (
            await conn.execute(
                select(
                    schedule.start_deadline_us,
                    schedule.pause_after_failed_runs,
                    schedule.failures_counted_until,
                )
            )
        ).one()
        assert tuple(safety) == (None, 0, None)
        assert (await conn.execute(select(run.state, run.late_by_us))).one() == ("completed", None)
    late = timedelta(hours=1) // timedelta(microseconds=1)
    async with db.transaction() as conn:
        await conn.execute(update(task_schedule_run).values(state="missed", late_by_us=late))
    with pytest.raises(IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(update(task_schedule_run).values(state="exploded"))


async def test_downgrade_reads_a_missed_run_as_completed_and_keeps_the_links(db_at_0018: Database) -> None:
    db = db_at_0018
    await _write_as_0018(db)
    await migrate(db, "0019")
    async with db.transaction() as conn:
        await conn.execute(update(task_schedule_run).values(state="missed"))
    await downgrade(db, "0018")
    assert await current_revision(db) == "0018"
    async with db.read() as conn:
        assert (await conn.execute(select(task_schedule_run.c.state))).scalar_one() == "completed"
        assert (await conn.execute(select(tasks.c.run_id).where(tasks.c.id == TASK))).scalar_one() == RUN
