"""Migration 0043 on a database holding tasks, on both databases: the new `task_step_state` is there and
empty, every task kept; a step's record is written and read back once upgraded, goes with its task, and
the downgrade drops the table and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, delete, insert, inspect

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType
from rackflow.domain.tasks import StepRecord
from rackflow.inventory.service import InventoryService
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import tasks
from tests.conftest import database_at, downgrade, table_counts, task_row, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

CLOCK = SystemClock()


@pytest.fixture
async def db_at_0042(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0042") as db:
        yield db


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


async def test_tasks_are_kept_step_records_written_read_and_back_down(db_at_0042: Database) -> None:
    db = db_at_0042
    rack = await InventoryService(db, CLOCK).create_rack(
        "r1", components=[ComponentSpec(ComponentType.COMPUTE, "n0")]
    )
    task_id = uuid.uuid4()
    async with db.transaction() as conn:  # as release 0042 inserts a task (no later column)
        pending = task_row(task_id, rack.id, datetime.now(UTC), status="pending", operation="power_reset")
        await conn.execute(insert(tasks).values({**pending, "parameters": {"kind": "power_reset"}}))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)

    owner, component_id = uuid.uuid4(), rack.components[0].id
    record = StepRecord(task_id, 1, component_id, {"power": "On", "last_reset_time": "2025-06-01T11:00:00Z"})
    async with db.transaction() as conn:
        await task_runs.mark_running(conn, task_id, owner_id=owner, now=datetime.now(UTC))
        assert await task_runs.record_steps(conn, [record], owner_id=owner) == {task_id}
        assert await task_runs.record_steps(conn, [record], owner_id=uuid.uuid4()) == set()
    async with db.read() as conn:
        assert await task_runs.steps_of(conn, {task_id: 1}) == {task_id: {component_id: record.values}}
        assert await task_runs.steps_of(conn, {task_id: 2}) == {}  # another attempt's steps start anew
    async with db.transaction() as conn:
        await conn.execute(delete(tasks).where(tasks.c.id == task_id))
    assert (await table_counts(db))["task_step_state"] == 0  # it goes with its task

    await downgrade(db, "0042")
    assert await current_revision(db) == "0042"
    async with db.engine.connect() as conn:
        assert "task_step_state" not in await conn.run_sync(_tables)
