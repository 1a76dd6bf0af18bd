"""Migration 0024 on a database that already holds runs, on both databases: every run's `outcome_counts`
is backfilled from its outcomes as `store.schedules.outcome_counts_to_json` counts them (a task id that is
JSON null or absent is no task; a run with no outcomes counts nothing), the index of a run's tasks by
status exists; and back down again, both gone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, insert, inspect, select

from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from rackflow.store.schedules import outcome_counts_to_json, outcome_from_json
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade
from tests.e2e.cluster import sql

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SCHEDULE = uuid.uuid4()


@pytest.fixture
async def db_at_0023(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0023") as db:
        yield db


def _outcome(outcome: str, task: bool | None) -> dict[str, Any]:
    """An outcome as stored; `task` None: the key absent, as an old writer may have left it."""
    found: dict[str, Any] = {"scope_id": str(uuid.uuid4()), "rack_id": str(uuid.uuid4()), "outcome": outcome}
    if task is not None:
        found["task_id"] = str(uuid.uuid4()) if task else None
    return found


RUNS: dict[uuid.UUID, list[dict[str, Any]]] = {
    uuid.uuid4(): [_outcome("submitted", True)] * 3 + [_outcome("failed", False), _outcome("failed", None)],
    uuid.uuid4(): [_outcome("pending", False), _outcome("submitted", True), _outcome("not_started", None)],
    uuid.uuid4(): [_outcome("missed", False)] * 2,
    uuid.uuid4(): [],
}
# Each run's counts as the code counts its outcomes: what 0024 must store.
EXPECTED_COUNTS = {
    run_id: outcome_counts_to_json([outcome_from_json(o) for o in outcomes])
    for run_id, outcomes in RUNS.items()
}


async def _write_as_0023(db: Database) -> None:
    """Rows of 0023's columns (an insert names only the columns it is given)."""
    async with db.transaction() as conn:
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
        for run_id, outcomes in RUNS.items():
            await conn.execute(
                insert(task_schedule_run).values(
                    id=run_id,
                    schedule_id=SCHEDULE,
                    fired_at=T0,
                    trigger="manual",
                    state="completed",
                    outcomes=outcomes,
                )
            )


def _schema(conn: Connection) -> tuple[set[str], set[str]]:
    found = inspect(conn)
    return (
        {c["name"] for c in found.get_columns("task_schedule_run")},
        {str(i["name"]) for i in found.get_indexes("tasks")},
    )


async def _stored_counts(db: Database) -> dict[uuid.UUID, object]:
    """Each run's `outcome_counts` as stored."""
    async with db.read() as conn:
        stmt = select(task_schedule_run.c.id, task_schedule_run.c.outcome_counts)
        return {row.id: row.outcome_counts for row in (await conn.execute(stmt)).all()}


async def test_the_counts_are_backfilled_from_the_outcomes(db_at_0023: Database) -> None:
    db = db_at_0023
    await _write_as_0023(db)
    assert await migrate(db, "0024") == "0024"
    found = await _stored_counts(db)
    assert found == EXPECTED_COUNTS
    assert [found[run_id] for run_id in RUNS] == [
        {"submitted": [0, 3], "failed": [2, 0]},
        {"pending": [1, 0], "submitted": [0, 1], "not_started": [1, 0]},
        {"missed": [2, 0]},
        {},
    ]
    async with db.engine.connect() as conn:
        columns, indexes = await conn.run_sync(_schema)
    assert "outcome_counts" in columns and "ix_tasks_run_id_status" in indexes

    await downgrade(db, "0023")
    assert await current_revision(db) == "0023"
    async with db.engine.connect() as conn:
        columns, indexes = await conn.run_sync(_schema)
    assert "outcome_counts" not in columns and "ix_tasks_run_id_status" not in indexes


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)  # 0024 in steps
async def test_a_try_stopped_half_way_is_finished_on_postgresql(db_at_0023: Database) -> None:
    """On PostgreSQL 0024 runs outside a transaction, step by step (its docstring), so a try that stopped
    half-way (killed, or given up waiting for a lock) leaves its steps' work behind: here an index of its
    name left invalid by an interrupted CONCURRENTLY build, and the column added with one run counted. The
    next try drops the invalid index and builds it again, and counts the runs left."""
    db = db_at_0023
    await _write_as_0023(db)
    # Every run is of one schedule: the unique build fails, leaving its index invalid.
    with pytest.raises(psycopg.errors.UniqueViolation):
        sql(
            db.url,
            "CREATE UNIQUE INDEX CONCURRENTLY ix_tasks_run_id_status ON task_schedule_run (schedule_id)",
        )
    assert sql(
        db.url, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_tasks_run_id_status'::regclass"
    ) == [(False,)]
    first = next(iter(RUNS))
    sql(db.url, "ALTER TABLE task_schedule_run ADD COLUMN outcome_counts jsonb NOT NULL DEFAULT '{}'")
    sql(
        db.url,
        """UPDATE task_schedule_run SET outcome_counts = '{"submitted": [0, 3], "failed": [2, 0]}'
        WHERE id = %s""",
        first,
    )

    assert await migrate(db, "0024") == "0024"
    found = await _stored_counts(db)
    assert found == EXPECTED_COUNTS
    assert sql(
        db.url,
        "SELECT indrelid::regclass::text, indisvalid FROM pg_index"
        " WHERE indexrelid = 'ix_tasks_run_id_status'::regclass",
    ) == [("tasks", True)]
