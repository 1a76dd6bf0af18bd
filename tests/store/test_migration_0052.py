"""Migration 0052 on a database holding a schedule's tasks in two statuses, on both databases: every task
kept, the list by schedule and status read back; the index of a schedule's tasks replaced by one under
its new name, which on PostgreSQL carries the status (INCLUDE) and is valid, the old one gone; a run cut
short (the new one left invalid, the old one still there) finished by running it again; and back down
again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.domain.tasks import TaskStatus
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from rackflow.store.tables import racks, task_schedule, tasks
from tests.conftest import database_at, downgrade, schedule_row, table_counts, task_row, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build

pytestmark = pytest.mark.asyncio

OLD = "ix_tasks_schedule_id_created_at_id"
NEW = "ix_tasks_schedule_id_created_at_id_status"
T0 = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
async def db_at_0051(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0051") as db:
        yield db


async def _tasks(db: Database) -> tuple[uuid.UUID, dict[str, list[uuid.UUID]]]:
    """A schedule with four completed tasks and two failed ones, as release 0051 writes them: the
    schedule, and its tasks' ids by status, newest first."""
    rack, schedule = uuid.uuid4(), uuid.uuid4()
    made: dict[str, list[uuid.UUID]] = {"completed": [], "failed": []}
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack, name="r1", created_at=T0))
        await conn.execute(insert(task_schedule).values(**schedule_row(schedule, "nightly", T0)))
        for n in range(6):
            status = "failed" if n % 3 == 1 else "completed"
            row = task_row(uuid.uuid4(), rack, T0 + timedelta(minutes=n), schedule_id=schedule, status=status)
            await conn.execute(insert(tasks).values(**row))
            made[status].insert(0, row["id"])  # type: ignore[arg-type]
    return schedule, made


def _indexes(conn: Connection) -> dict[str, list[str]]:
    """The indexes of tasks led by the schedule: name -> their columns, the INCLUDEd ones after "+"."""
    found = {}
    for index in inspect(conn).get_indexes("tasks"):
        if index["column_names"][:1] == ["schedule_id"]:
            included = index.get("include_columns") or index.get("dialect_options", {}).get(
                "postgresql_include"
            )
            found[index["name"]] = [*index["column_names"], *(f"+{c}" for c in included or [])]
    return found


async def _listed(db: Database, schedule: uuid.UUID, status: TaskStatus) -> list[uuid.UUID]:
    async with db.read() as conn:
        found, total = await task_store.list_tasks(
            conn, rack_id=None, schedule_id=schedule, active_only=False, statuses=[status], offset=0, limit=10
        )
    assert total == len(found)
    return [t.id for t in found]


async def test_tasks_are_kept_and_listed_by_schedule_and_status_and_back_down(db_at_0051: Database) -> None:
    db = db_at_0051
    schedule, made = await _tasks(db)
    before = await table_counts(db)

    assert await migrate(db, "0052") == "0052"
    assert await table_counts(db) == upgraded_counts(before)
    for status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        assert await _listed(db, schedule, status) == made[status.value]
    columns = ["schedule_id", "created_at", "id"]
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_indexes) == {NEW: columns + (["+status"] if db.is_postgres else [])}
    if db.is_postgres:
        assert await index_valid(db, NEW) is True

    await downgrade(db, "0051")
    assert await current_revision(db) == "0051"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_indexes) == {OLD: columns}
    assert (await table_counts(db))["tasks"] == 6


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_run_cut_short_is_finished_by_running_it_again(db_at_0051: Database) -> None:
    """As a killed migration leaves it: the new index built but invalid, the old one not yet dropped.
    Migrating again builds the new one anew and drops the old."""
    db = db_at_0051
    schedule, made = await _tasks(db)
    await leave_an_invalid_build(db, NEW, "tasks", "schedule_id")

    assert await migrate(db, "0052") == "0052"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_indexes) == {NEW: ["schedule_id", "created_at", "id", "+status"]}
    assert await index_valid(db, NEW) is True
    assert await _listed(db, schedule, TaskStatus.FAILED) == made["failed"]
