"""Migration 0062 on a database holding tasks as release 0061 wrote them (a random id and a time-ordered one,
one ended and one running, with attempts and step records), on both databases: every row kept; on
PostgreSQL the tasks and the five tables referencing them partitioned by filing time, the tables found the
partitions before the weeks (no row moved), the running task found by id and finished, one task per rack
per firing held for a run of before the migration, a new firing's tasks filed in their week, a task's
deletion taking its rows with it; back down again, and up a second time."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, delete, insert, select, text

from rackflow.domain.tasks import StepRecord, TaskAttempt, TaskStatus
from rackflow.errors import AlreadyExists
from rackflow.ids import id_at_time, id_beside
from rackflow.store import task_partitions, task_runs
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import (
    components,
    instances,
    racks,
    task_attempt,
    task_schedule,
    task_schedule_run,
    task_step_state,
    tasks,
)
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
RACK, COMPONENT, OWNER = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
RUN = id_at_time(T0)  # a firing of before the migration
OLD_TASK = uuid.uuid4()  # made before rackflow's ids were time-ordered
RUNNING = id_beside(RUN)
SCHEDULE = uuid.uuid4()
# A manual run whose id tells a time after the weeks begin (BOUND): its tasks are filed in a week.
LATER_RUN = id_at_time(datetime.now(UTC) + timedelta(days=15))


@pytest.fixture
async def db_at_0061(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0061") as db:
        yield db


def _task(task_id: uuid.UUID, status: str, **more: object) -> dict[str, object]:
    return {
        "id": task_id,
        "operation": "power_on",
        "parameters": {"kind": "power_on"},
        "rack_id": RACK,
        "component_ids": [str(COMPONENT)],
        "status": status,
        "created_at": T0,
        "updated_at": T0,
        **more,
    }


async def _write_as_0061(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(components).values(id=COMPONENT, rack_id=RACK, name="c0", type="COMPUTE", created_at=T0)
        )
        await conn.execute(
            insert(instances).values(id=OWNER, host="h", pid=1, started_at=T0, heartbeat_at=T0)
        )
        await conn.execute(insert(task_schedule).values(schedule_row(SCHEDULE, "nightly", T0)))
        for run_id, slot in ((RUN, T0), (LATER_RUN, None)):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=run_id,
                    schedule_id=SCHEDULE,
                    fired_at=T0,
                    scheduled_for=slot,
                    trigger="dispatch" if slot else "manual",
                    state="running",
                    outcomes=[],
                )
            )
        await conn.execute(insert(tasks).values(_task(OLD_TASK, "completed", finished_at=T0)))
        await conn.execute(
            insert(tasks).values(
                _task(RUNNING, "running", run_id=RUN, owner_id=OWNER, started_at=T0, attempt_started_at=T0)
            )
        )
        await conn.execute(
            insert(task_attempt).values(task_id=OLD_TASK, attempt=1, finished_at=T0, status="completed")
        )
        await conn.execute(
            insert(task_step_state).values(task_id=RUNNING, attempt=1, component_id=COMPONENT, recorded={})
        )


def _homes(conn: Connection) -> dict[str, set[str]]:
    """Each table's partitions that hold its rows (SQLite: the table itself)."""
    found: dict[str, set[str]] = {}
    for table in (tasks, task_attempt, task_step_state):
        where = "tableoid::regclass::text" if conn.dialect.name == "postgresql" else f"'{table.name}'"
        found[table.name] = set(conn.execute(text(f"SELECT DISTINCT {where} FROM {table.name}")).scalars())
    return found


async def test_the_tasks_are_partitioned_keeping_every_row_and_rule_and_back_down(
    db_at_0061: Database,
) -> None:
    db = db_at_0061
    await _write_as_0061(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.engine.connect() as conn:
        homes = await conn.run_sync(_homes)
    if db.is_postgres:
        assert homes == {"tasks": {"tasks_before"}, "task_attempt": {"task_attempt_before"},
                         "task_step_state": {"task_step_state_before"}}  # fmt: skip
        async with db.read() as conn:
            filed = set((await conn.execute(select(tasks.c.filed_at))).scalars())
            weeks = await conn.run_sync(task_partitions.weeks)
        assert filed == {task_partitions.LONG_AGO}
        assert weeks, "no week made"
    else:
        assert homes == {name: {name} for name in ("tasks", "task_attempt", "task_step_state")}

    # The running task, filed before the weeks, is found by id: its step recorded again, then finished.
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        record = StepRecord(RUNNING, 1, COMPONENT, {"power": "on"})
        assert await task_runs.record_steps(conn, [record], owner_id=OWNER) == {RUNNING}
        done = {RUNNING: (TaskStatus.COMPLETED, "")}
        assert await task_runs.finish(conn, done, owner_id=OWNER, now=now) == {RUNNING}
    async with db.read() as conn:
        (running,) = await task_store.get_tasks(conn, [RUNNING])
        assert (await task_runs.steps_of(conn, {RUNNING: 1}))[RUNNING][COMPONENT] == {"power": "on"}
    assert running.status is TaskStatus.COMPLETED

    # One task per rack per firing, for a firing of before the migration.
    with pytest.raises(AlreadyExists):
        async with db.transaction() as conn:
            await task_store.insert_tasks(conn, [replace(running, id=id_beside(RUN))])
    # A firing's task of after BOUND is filed in its week (its run's millisecond), with its attempt.
    fresh = replace(running, id=id_beside(LATER_RUN), run_id=LATER_RUN)
    async with db.transaction() as conn:
        await task_store.insert_tasks(conn, [fresh])
        await task_runs.record_attempts(conn, [_attempt(fresh.id)])
    async with db.engine.connect() as conn:
        homes = await conn.run_sync(_homes)
    if db.is_postgres:
        week = task_partitions.partition_name("tasks", _monday(task_partitions.filed_at(fresh.id)))
        assert homes["tasks"] == {"tasks_before", week}
        assert homes["task_attempt"] == {"task_attempt_before", week.replace("tasks", "task_attempt", 1)}
    # A task's rows go with it, in its week as before the weeks.
    async with db.transaction() as conn:
        await conn.execute(delete(tasks).where(tasks.c.id.in_([fresh.id, OLD_TASK])))
    async with db.read() as conn:
        assert (await conn.execute(select(task_attempt.c.task_id))).scalars().all() == []

    after_upgrade = await table_counts(db)
    await downgrade(db, "0061")
    assert await current_revision(db) == "0061"
    assert await table_counts(db) == {k: v for k, v in after_upgrade.items() if k in before}
    if db.is_postgres:
        async with db.read() as conn:
            kind = await conn.scalar(text("SELECT relkind::text FROM pg_class WHERE oid = 'tasks'::regclass"))
        assert kind == "r"
    assert await migrate(db) == head_revision()  # up again, on the tables the downgrade made
    assert await schema_diff(db) == []


def _attempt(task_id: uuid.UUID) -> TaskAttempt:
    return TaskAttempt(task_id, 1, T0, T0 + timedelta(minutes=1), TaskStatus.FAILED, "boom", True)


def _monday(at: datetime) -> datetime:
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())
