"""Migration 0035 on a database holding runs and a retry of one, on both databases: every row kept, the
index on `retry_of` replaced by one holding only the retries, which `store.rollouts.retried_by` still
looks its runs up by; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.store import rollouts
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.query_plans import by_parent_index, statement_sent
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EVERY_RUN = "ix_task_schedule_run_retry_of"
RETRIES = "ix_task_schedule_run_retries"


@pytest.fixture
async def db_at_0034(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0034") as db:
        yield db


async def _runs_and_a_retry(db: Database) -> tuple[uuid.UUID, uuid.UUID]:
    """Three runs of one schedule, the last a retry of the first: (the first, its retry)."""
    schedule = uuid.uuid4()
    first, second, retry = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule).values(
                id=schedule,
                name="nightly",
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}},
                created_at=T0,
                updated_at=T0,
            )
        )
        for n, (run, retry_of) in enumerate(((first, None), (second, None), (retry, first))):
            await conn.execute(
                insert(task_schedule_run).values(
                    id=run,
                    schedule_id=schedule,
                    fired_at=T0 + timedelta(minutes=n),
                    trigger="manual",
                    state="completed",
                    outcomes=[],
                    retry_of=retry_of,
                )
            )
    return first, retry


def _retry_indexes(conn: Connection) -> set[str]:
    return {index["name"] for index in inspect(conn).get_indexes("task_schedule_run")} & {EVERY_RUN, RETRIES}


async def _plan_of_retried_by(db: Database, run_id: uuid.UUID) -> str:
    """The plan of `retried_by`'s statement, with PostgreSQL told to avoid a scan of the (tiny) table, so
    it names the index whenever one answers the lookup."""
    statement, parameters = await statement_sent(db, lambda conn: rollouts.retried_by(conn, [run_id]))
    async with db.engine.connect() as conn:
        if db.is_postgres:
            await conn.exec_driver_sql("SET enable_seqscan = off")
            prefix = "EXPLAIN "
        else:
            prefix = "EXPLAIN QUERY PLAN "
        rows = (await conn.exec_driver_sql(prefix + statement, parameters)).all()
        plan = await by_parent_index(conn, "\n".join(str(value) for row in rows for value in row))
        await conn.rollback()
    return plan


async def test_only_retries_are_indexed_and_still_found_and_back_down(db_at_0034: Database) -> None:
    db = db_at_0034
    first, retry = await _runs_and_a_retry(db)
    before = await table_counts(db)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_retry_indexes) == {EVERY_RUN}

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_retry_indexes) == {RETRIES}
    async with db.read() as conn:
        assert await rollouts.retried_by(conn, [first, retry]) == {first: [retry]}
    # `retry_of IN (…)` implies the predicate `retry_of IS NOT NULL` on both databases.
    assert RETRIES in await _plan_of_retried_by(db, first)

    await downgrade(db, "0034")
    assert await current_revision(db) == "0034"
    async with db.engine.connect() as conn:
        assert await conn.run_sync(_retry_indexes) == {EVERY_RUN}
    async with db.read() as conn:
        assert await rollouts.retried_by(conn, [first]) == {first: [retry]}
