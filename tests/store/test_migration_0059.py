"""Migration 0059 on a database holding NVLink domains, on both databases: the domain list's token is made
with the table, every kind of change the triggers watch replaces it (a release before it writing, as a
rolling upgrade's would), and the downgrade takes the table and its triggers away, leaving the writes of
that release working."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, text, update

from rackflow.store import inventory
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import nvl_domains, racks
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
async def db_at_0058(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0058") as db:
        yield db


async def _token(db: Database) -> str | None:
    async with db.read() as conn:
        return await inventory.domain_list_token(conn)


async def _write_as_0058_does(db: Database) -> None:
    """A domain and a rack joining it, as a release of 0058 writes them (it knows nothing of the token)."""
    domain_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(nvl_domains).values(id=domain_id, name=f"d-{domain_id}", created_at=T0))
        rack_id = uuid.uuid4()
        await conn.execute(insert(racks).values(id=rack_id, name=f"r-{rack_id}", created_at=T0))
        await conn.execute(update(racks).where(racks.c.id == rack_id).values(nvl_domain_id=domain_id))


async def test_the_token_is_made_replaced_by_an_older_release_s_writes_and_taken_away(
    db_at_0058: Database,
) -> None:
    db = db_at_0058
    await _write_as_0058_does(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    made = await _token(db)
    assert made is not None
    await _write_as_0058_does(db)
    replaced = await _token(db)
    assert replaced not in (None, made)

    await downgrade(db, "0058")
    assert await current_revision(db) == "0058"
    async with db.read() as conn:
        tables = await conn.run_sync(lambda sync: sync.dialect.get_table_names(sync))
    assert "domain_list_version" not in tables
    await _write_as_0058_does(db)  # no trigger left behind naming what is gone
    assert (await table_counts(db))["racks"] == 3
    if db.is_postgres:
        async with db.read() as conn:
            left = await conn.execute(
                text("SELECT count(*) FROM pg_proc WHERE proname = 'domain_list_changed'")
            )
            assert left.scalar_one() == 0
