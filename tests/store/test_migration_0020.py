"""Migration 0020 on a database holding 0019's schedules, runs and tasks, on both databases: a schedule
has no retry policy, a run retries no other, a running task is on its first attempt of one (its start
kept, the attempt's start unknown), and nothing else changes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert

from rackflow.domain.tasks import TaskStatus
from rackflow.store import rollouts, schedules
from rackflow.store.db import Database
from rackflow.store.migrate import head_revision, migrate
from rackflow.store.tables import racks, task_schedule, task_schedule_run, tasks
from rackflow.store.tasks import get_task
from tests.conftest import database_at

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
RACK, SCHEDULE, RUN, TASK = (uuid.uuid4() for _ in range(4))


@pytest.fixture
async def db_at_0019(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0019") as db:
        yield db


async def test_existing_rows_have_no_retries_and_one_attempt(db_at_0019: Database) -> None:
    db = db_at_0019
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
            insert(task_schedule_run).values(
                id=RUN, schedule_id=SCHEDULE, fired_at=T0, trigger="manual", state="completed", outcomes=[]
            )
        )
        await conn.execute(
            insert(tasks).values(
                id=TASK,
                operation="power_off",
                parameters={"kind": "power_off", "forced": False},
                rack_id=RACK,
                component_ids=[],
                status="running",
                message="powering off 1/1: c0",
                created_at=T0,
                started_at=T0,
                updated_at=T0,
                schedule_id=SCHEDULE,
                run_id=RUN,
                attempts=1,
            )
        )
    assert await migrate(db) == head_revision()
    async with db.read() as conn:
        task = await get_task(conn, TASK)
        schedule = await schedules.get_schedule(conn, SCHEDULE)
        run = await rollouts.get_run(db, conn, RUN)
        retried_by = await rollouts.retried_by(conn, [RUN])
    assert task is not None and schedule is not None and run is not None
    assert (task.status, task.started_at, task.message) == (TaskStatus.RUNNING, T0, "powering off 1/1: c0")
    assert (task.retry, task.attempt, task.max_attempts, task.attempt_started_at) == (None, 1, 1, None)
    assert schedule.retry is None and schedule.name == "nightly"
    assert (run.retry_of, run.state, retried_by) == (None, "completed", {})
