"""Migration 0060 on a database holding schedules with and without an approval policy, on both databases:
every schedule kept, the start-up look at the policies reading them back from the new index; on
PostgreSQL the index built (valid), a build left invalid by a killed migration built again, and back down
again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, null, text

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEX = "ix_task_schedule_approval_name"
T0 = datetime(2026, 6, 1, tzinfo=UTC)
POLICY = ApprovalPolicy(timedelta(hours=4), min_approvers=2)


@pytest.fixture
async def db_at_0059(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0059") as db:
        yield db


async def _schedules(db: Database) -> list[str]:
    """As release 0059 writes them: a schedule made without a policy (JSON's null), one whose policy was
    removed (JSON's null too), one with SQL's NULL, and two with a policy: the names of those two."""
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule), schedule_row(uuid.uuid4(), "plain", T0))
        await conn.execute(
            insert(task_schedule).values(approval=None), schedule_row(uuid.uuid4(), "removed", T0)
        )
        await conn.execute(
            insert(task_schedule).values(approval=null()), schedule_row(uuid.uuid4(), "by-hand", T0)
        )
        for name in ("fw-b", "fw-a"):
            await conn.execute(
                insert(task_schedule).values(approval=POLICY.to_json()), schedule_row(uuid.uuid4(), name, T0)
            )
    return ["fw-a", "fw-b"]


async def _looked_at(db: Database) -> list[str]:
    async with db.read(in_transaction=True) as conn:
        return [s.name async for s in store.approval_set_ups(conn)]


async def test_schedules_are_kept_and_looked_at_by_policy_and_back_down(db_at_0059: Database) -> None:
    db = db_at_0059
    with_policy = await _schedules(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _looked_at(db) == with_policy
    if db.is_postgres:
        assert await index_valid(db, INDEX) is True

    await downgrade(db, "0059")
    assert await current_revision(db) == "0059"
    if db.is_postgres:
        assert await index_valid(db, INDEX) is None
    else:
        async with db.engine.connect() as conn:
            found = await conn.execute(text("SELECT name FROM sqlite_master WHERE name = :i"), {"i": INDEX})
            assert found.first() is None
    assert (await table_counts(db))["task_schedule"] == 5


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_build_a_killed_migration_left_invalid_is_built_again(db_at_0059: Database) -> None:
    db = db_at_0059
    with_policy = await _schedules(db)
    await leave_an_invalid_build(db, INDEX, "task_schedule", "created_at")

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await index_valid(db, INDEX) is True
    async with db.engine.connect() as conn:
        definition = await conn.execute(text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": INDEX})
        assert "(name) WHERE" in definition.scalar_one()
    assert await _looked_at(db) == with_policy
