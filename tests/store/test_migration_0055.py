"""Migration 0055 on a database holding NVLink domains, on both databases: every domain kept with its racks,
listed a page at a time in the order of the index it builds (on PostgreSQL, valid; a build left invalid by a
killed migration built again), and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text

from rackflow.store import inventory
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import nvl_domains, racks
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEX = "ix_nvl_domains_created_at_id"
T0 = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
async def db_at_0054(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0054") as db:
        yield db


async def _domains(db: Database) -> list[uuid.UUID]:
    """Three domains as release 0054 writes them, the first with a rack: their ids, oldest first."""
    made = [uuid.uuid4() for _ in range(3)]
    async with db.transaction() as conn:
        for i, domain_id in enumerate(made):
            at = T0 + timedelta(seconds=i)
            await conn.execute(insert(nvl_domains).values(id=domain_id, name=f"d{i}", created_at=at))
        await conn.execute(
            insert(racks).values(id=uuid.uuid4(), name="r0", nvl_domain_id=made[0], created_at=T0)
        )
    return made


async def _paged(db: Database) -> list[uuid.UUID]:
    """The domains' ids, read two at a time after the key of each page's last."""
    ids: list[uuid.UUID] = []
    after = None
    async with db.read() as conn:
        while True:
            page, _ = await inventory.list_domains(conn, limit=2, after=after)
            ids += [uuid.UUID(d.id) for d in page]
            if len(page) < 2:
                return ids
            after = (page[-1].created_at, ids[-1])


async def test_domains_are_kept_and_paged_and_back_down(db_at_0054: Database) -> None:
    db = db_at_0054
    made = await _domains(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _paged(db) == made
    if db.is_postgres:
        assert await index_valid(db, INDEX) is True

    await downgrade(db, "0054")
    assert await current_revision(db) == "0054"
    if db.is_postgres:
        assert await index_valid(db, INDEX) is None
    assert (await table_counts(db))["nvl_domains"] == 3


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_build_a_killed_migration_left_invalid_is_built_again(db_at_0054: Database) -> None:
    db = db_at_0054
    made = await _domains(db)
    await leave_an_invalid_build(db, INDEX, "nvl_domains", "name")

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await index_valid(db, INDEX) is True
    async with db.engine.connect() as conn:
        definition = await conn.execute(text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": INDEX})
        assert "(created_at, id)" in definition.scalar_one()
    assert await _paged(db) == made
