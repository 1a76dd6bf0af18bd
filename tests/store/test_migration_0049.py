"""Migration 0049 on a database holding runs, on both databases: every run is kept, without a request id;
once upgraded, a second run of one (schedule, request id) is refused by the database (on PostgreSQL by the
DEFAULT partition's unique index, built valid), another schedule's is not; the downgrade drops the column
and its index and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect, select, text

from rackflow.store import runs as run_history
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
async def db_at_0048(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0048") as db:
        yield db


def _columns(conn: Connection) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns("task_schedule_run")}


async def test_runs_are_kept_one_run_per_request_id_and_back_down(db_at_0048: Database) -> None:
    db = db_at_0048
    ids = [uuid.uuid4(), uuid.uuid4()]
    async with db.transaction() as conn:  # as release 0048 records schedules and runs
        for n, schedule_id in enumerate(ids):
            await conn.execute(insert(task_schedule).values(schedule_row(schedule_id, f"s{n}", T0)))
        for slot in (T0, None, None):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=uuid.uuid4(),
                    schedule_id=ids[0],
                    fired_at=T0,
                    scheduled_for=slot,
                    trigger="dispatch" if slot else "manual",
                    state="completed",
                    outcomes=[],
                )
            )
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.read() as conn:
        found = await conn.execute(select(task_schedule_run.c.request_id))
        assert set(found.scalars()) == {None}
        if db.is_postgres:
            query = text("SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass(:i)")
            valid = (await conn.execute(query, {"i": "uq_task_schedule_run_default_request_id"})).one()
            assert tuple(valid) == (True, True)

    def run(schedule_id: uuid.UUID) -> run_history.NewRun:
        return run_history.NewRun(
            uuid.uuid4(),
            schedule_id,
            T0 + timedelta(hours=1),
            "manual",
            state="completed",
            request_id="req-1",
        )

    kept = [run(ids[0]), run(ids[1])]
    async with db.transaction() as conn:
        assert await run_history.insert_runs(db, conn, kept) == {r.run_id for r in kept}
        assert await run_history.insert_runs(db, conn, [run(ids[0])]) == set()
        assert (await run_history.run_of_request(conn, ids[0], "req-1")) is not None

    await downgrade(db, "0048")
    assert await current_revision(db) == "0048"
    async with db.engine.connect() as conn:
        assert "request_id" not in await conn.run_sync(_columns)
    assert await table_counts(db) == {**before, "task_schedule_run": before["task_schedule_run"] + 2}
