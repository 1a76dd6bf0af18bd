"""Migration 0006 on a database that already holds what 0005 wrote, on both databases: every row and link
kept (SQLite rebuilds `tasks`, which must not clear the scopes' last tasks), a slot recorded twice made
valid, and the new constraints in force afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from rackflow.errors import AlreadyExists
from rackflow.store import runs as store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import (
    instances,
    racks,
    task_schedule,
    task_schedule_run,
    task_schedule_scope,
    tasks,
)
from tests.conftest import database_at, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
RACK, SCHEDULE, SCOPE, TASK, OTHER_TASK = (uuid.uuid4() for _ in range(5))
RUN_A, RUN_B, RUN_REPEAT, RUN_MANUAL = (uuid.uuid4() for _ in range(4))


@pytest.fixture
async def db_at_0005(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0005") as db:
        yield db


def _task(task_id: uuid.UUID, status: str, created: datetime) -> dict[str, Any]:
    return {
        "id": task_id,
        "operation": "power_off",
        "parameters": {"kind": "power_off", "forced": False},
        "rack_id": RACK,
        "component_ids": [],
        "description": f"nightly — {created.isoformat()}",
        "status": status,
        "created_at": created,
        "updated_at": created,
        "schedule_id": SCHEDULE,
    }


def _run(
    run_id: uuid.UUID, fired: datetime, slot: datetime | None, trigger: str = "dispatch"
) -> dict[str, Any]:
    return {
        "id": run_id,
        "schedule_id": SCHEDULE,
        "fired_at": fired,
        "scheduled_for": slot,
        "trigger": trigger,
        "state": "completed",
        "outcomes": [],
    }


async def _write_as_0005(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(task_schedule).values(
                id=SCHEDULE,
                name="nightly",
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                next_run_at=T0 + 3 * HOUR,
                created_at=T0,
                updated_at=T0,
            )
        )
        await conn.execute(
            insert(tasks), [_task(OTHER_TASK, "completed", T0), _task(TASK, "running", T0 + HOUR)]
        )
        await conn.execute(
            insert(task_schedule_scope).values(
                id=SCOPE, schedule_id=SCHEDULE, rack_id=RACK, last_task_id=TASK, created_at=T0
            )
        )
        await conn.execute(
            insert(task_schedule_run),
            [
                _run(RUN_A, T0, T0),
                _run(RUN_B, T0 + HOUR, T0 + HOUR),
                # The same slot again, later (a clock set back on SQLite, then a resume): 0006 unslots it.
                _run(RUN_REPEAT, T0 + 2 * HOUR, T0 + HOUR),
                _run(RUN_MANUAL, T0 + 2 * HOUR, None, "manual"),
            ],
        )
        await conn.execute(
            insert(instances).values(id=uuid.uuid4(), host="h", pid=1, started_at=T0, heartbeat_at=T0)
        )


# Columns that revisions after 0006 add: the rows are compared over the columns they had at 0005.
LATER_COLUMNS = {
    "task_schedule": (
        "pause_reason",
        "paused_by",
        "paused_at",
        "resume_at",
        "window_policy",
        "rollout",
        "approval",
        "last_edited_by",
        "start_deadline_us",
        "pause_after_failed_runs",
        "failures_counted_until",
        "retry",
        "scope_removed_after",
        "run_count",
        "runs_since",
    ),
    "tasks": (
        "not_before",
        "ignore_windows",
        "not_after",
        "held_by",
        "held_reason",
        "held_since",
        "retry",
        "attempt",
        "attempt_started_at",
        "refusal",
        "filed_at",
    ),
    "task_schedule_run": (
        "rollout",
        "reason",
        "failures_excused",
        "resumed",
        "approval",
        "approval_expires_at",
        "late_by_us",
        "retry_of",
        "task_counts",
        "tasks_deleted",
    ),
}


async def _rows(db: Database, table: Any, *skip: str) -> list[tuple[Any, ...]]:
    later = LATER_COLUMNS.get(table.name, ())
    columns = [c for c in table.c if c.name not in skip and c.name not in later]
    async with db.read() as conn:
        return sorted((await conn.execute(select(*columns))).all(), key=str)


async def test_upgrade_keeps_every_row_and_link_and_unslots_a_repeated_slot(db_at_0005: Database) -> None:
    db = db_at_0005
    await _write_as_0005(db)
    counts = upgraded_counts(await table_counts(db))
    tasks_before = await _rows(db, tasks, "run_id")
    scopes_before = await _rows(db, task_schedule_scope)
    schedules_before = await _rows(db, task_schedule)

    assert await migrate(db) == head_revision() == await current_revision(db)

    assert await table_counts(db) == counts
    assert await _rows(db, tasks, "run_id") == tasks_before
    assert await _rows(db, task_schedule_scope) == scopes_before  # last_task_id survived the rebuild
    assert await _rows(db, task_schedule) == schedules_before
    async with db.read() as conn:
        assert set((await conn.execute(select(tasks.c.run_id))).scalars()) == {None}
        slots = dict(
            (await conn.execute(select(task_schedule_run.c.id, task_schedule_run.c.scheduled_for))).all()
        )
    assert slots == {RUN_A: T0, RUN_B: T0 + HOUR, RUN_REPEAT: None, RUN_MANUAL: None}

    assert await schema_diff(db) == []


async def test_after_the_upgrade_the_constraints_refuse_duplicates(db_at_0005: Database) -> None:
    db = db_at_0005
    await _write_as_0005(db)
    await migrate(db)
    again = store.NewRun(uuid.uuid4(), SCHEDULE, T0 + 3 * HOUR, "dispatch", T0 + HOUR)  # RUN_B's slot
    async with db.transaction() as conn:
        assert await store.insert_runs(db, conn, [again]) == set()
    async with db.read() as conn:
        (task,) = await task_store.get_tasks(conn, [TASK])
    linked = replace(task, id=uuid.uuid4(), run_id=RUN_B)
    async with db.transaction() as conn:
        await task_store.insert_tasks(conn, [linked])
    with pytest.raises(AlreadyExists, match="run_id"):
        async with db.transaction() as conn:
            await task_store.insert_tasks(conn, [replace(linked, id=uuid.uuid4())])
