"""Migration 0053 on a database holding schedules of two operations, some paused, on both databases: every
schedule kept, the paused schedules' list filtered by operation read back; on PostgreSQL the paused
schedules' index of the operation built (valid), a build left invalid by a killed migration built again,
and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text

from rackflow.domain.tasks import OperationKind
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule
from tests.conftest import database_at, downgrade, schedule_row, table_counts, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEX = "ix_task_schedule_paused_operation_kind"
T0 = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
async def db_at_0052(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0052") as db:
        yield db


async def _schedules(db: Database) -> dict[OperationKind, list[uuid.UUID]]:
    """Three power-off schedules and one firmware upgrade, as release 0052 writes them, the second and the
    third paused: the paused ones' ids by operation, in creation order."""
    paused: dict[OperationKind, list[uuid.UUID]] = {
        OperationKind.POWER_OFF: [],
        OperationKind.UPGRADE_FIRMWARE: [],
    }
    async with db.transaction() as conn:
        for i, kind in enumerate(
            [OperationKind.POWER_OFF] * 2 + [OperationKind.UPGRADE_FIRMWARE, OperationKind.POWER_OFF]
        ):
            row = schedule_row(uuid.uuid4(), f"s{i}", T0 + timedelta(minutes=i))
            row["operation_template"] = {"operation": {"kind": kind.value}, "queue_timeout_seconds": 3600}
            row["enabled"] = i not in (1, 2)
            await conn.execute(insert(task_schedule), row)
            if not row["enabled"]:
                paused[kind].append(row["id"])  # type: ignore[arg-type]
    return paused


async def _listed(db: Database, kind: OperationKind) -> list[uuid.UUID]:
    async with db.read(in_transaction=True) as conn:
        found, total = await store.list_schedules(conn, operation=kind, paused_only=True, limit=10)
    assert total == len(found)
    return [s.id for s in found]


async def test_schedules_are_kept_and_listed_by_operation_and_back_down(db_at_0052: Database) -> None:
    db = db_at_0052
    made = await _schedules(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    for kind, ids in made.items():
        assert await _listed(db, kind) == ids
    assert await _listed(db, OperationKind.INGEST) == []
    if db.is_postgres:
        assert await index_valid(db, INDEX) is True

    await downgrade(db, "0052")
    assert await current_revision(db) == "0052"
    if db.is_postgres:
        assert await index_valid(db, INDEX) is None
    assert (await table_counts(db))["task_schedule"] == 4


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_build_a_killed_migration_left_invalid_is_built_again(db_at_0052: Database) -> None:
    db = db_at_0052
    made = await _schedules(db)
    await leave_an_invalid_build(db, INDEX, "task_schedule", "name")

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await index_valid(db, INDEX) is True
    async with db.engine.connect() as conn:
        columns = await conn.execute(text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": INDEX})
        assert "operation_template" in columns.scalar_one()
    assert await _listed(db, OperationKind.UPGRADE_FIRMWARE) == made[OperationKind.UPGRADE_FIRMWARE]
