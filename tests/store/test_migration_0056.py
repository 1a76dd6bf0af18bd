"""Migration 0056 on a database holding racks and NVLink domains, on both databases: every row kept, the
name searches' answers the same, their trigram indexes built on PostgreSQL (valid; a build left invalid by a
killed migration built again), and back down again. And on PostgreSQL, migrated by a role that may not
create extensions: `pg_trgm` is 0027's, so 0056 needs no privilege for it; were it dropped since, 0056
fails as 0027 does, naming the statement a superuser must run, before building anything."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from rackflow.errors import FailedPrecondition
from rackflow.store import inventory
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import nvl_domains, racks
from tests.conftest import database_at, downgrade, postgres_admin_url, table_counts, upgraded_counts
from tests.e2e.cluster import fresh_postgres_database, sql
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEXES = {"ix_racks_name_trgm": "racks", "ix_nvl_domains_name_trgm": "nvl_domains"}
T0 = datetime(2026, 6, 1, tzinfo=UTC)
RACK_NAMES = ["gb200-r00001", "gb200-r00002", "GB200-50%_off"]


@pytest.fixture
async def db_at_0055(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0055") as db:
        yield db


async def _inventory(db: Database) -> None:
    """Two domains and three racks as release 0055 writes them."""
    domain = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(nvl_domains).values(id=domain, name="nvl-00001", created_at=T0))
        await conn.execute(insert(nvl_domains).values(id=uuid.uuid4(), name="nvl-00002", created_at=T0))
        for i, name in enumerate(RACK_NAMES):
            at = T0 + timedelta(seconds=i)
            await conn.execute(
                insert(racks).values(id=uuid.uuid4(), name=name, nvl_domain_id=domain, created_at=at)
            )


async def _searched(db: Database) -> list[list[str]]:
    """What the searches answer: ListRacks' names for a long and a short text, and the picker's."""
    async with db.read() as conn:
        found = [
            [
                r.name
                for r in (
                    await inventory.list_racks(conn, nvl_domain_id=None, offset=0, limit=10, name_contains=t)
                )[0]
            ]
            for t in ("GB200-R", "50%_", "r0", "%")
        ]
        found.append((await inventory.names_holding(conn, racks, "gb200", 20))[0])
        found.append((await inventory.names_holding(conn, nvl_domains, "L-0000", 20))[0])
    return found


SEARCHED = [
    ["gb200-r00001", "gb200-r00002"],
    ["GB200-50%_off"],
    ["gb200-r00001", "gb200-r00002"],
    ["GB200-50%_off"],
    ["GB200-50%_off", "gb200-r00001", "gb200-r00002"],
    ["nvl-00001", "nvl-00002"],
]


async def test_the_inventory_is_kept_and_searched_and_back_down(db_at_0055: Database) -> None:
    db = db_at_0055
    await _inventory(db)
    before = await table_counts(db)
    assert await _searched(db) == SEARCHED

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _searched(db) == SEARCHED
    if db.is_postgres:
        for index in INDEXES:
            assert await index_valid(db, index) is True

    await downgrade(db, "0055")
    assert await current_revision(db) == "0055"
    if db.is_postgres:
        for index in INDEXES:
            assert await index_valid(db, index) is None
    assert await _searched(db) == SEARCHED


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
@pytest.mark.parametrize("index", list(INDEXES))
async def test_a_build_a_killed_migration_left_invalid_is_built_again(
    db_at_0055: Database, index: str
) -> None:
    db = db_at_0055
    await _inventory(db)
    await leave_an_invalid_build(db, index, INDEXES[index], "created_at")

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    for built in INDEXES:
        assert await index_valid(db, built) is True
    async with db.engine.connect() as conn:
        definition = await conn.execute(text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": index})
        assert "gin (name gin_trgm_ops)" in definition.scalar_one()
    assert await _searched(db) == SEARCHED


@pytest.fixture
def role() -> Iterator[str]:
    """A role that is not a superuser, and may not create extensions in the databases it is given."""
    name = f"rackflow_migrator_{uuid.uuid4().hex[:10]}"
    sql(postgres_admin_url(), f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    yield name
    sql(postgres_admin_url(), f'DROP ROLE IF EXISTS "{name}"')


@pytest.fixture
async def admin_url_at_0055(postgres_url: str, role: str) -> AsyncIterator[str]:
    """A database the superuser owns, migrated by `role` to 0055 (0027's extension created beforehand by
    the superuser, as an operator does for a role that may not): its superuser's URL. `postgres_url` only
    to fail under CI, or skip elsewhere, when the server is unreachable."""
    with fresh_postgres_database(postgres_admin_url()) as admin_url:
        sql(admin_url, f'GRANT USAGE, CREATE ON SCHEMA public TO "{role}"')
        sql(admin_url, "CREATE EXTENSION IF NOT EXISTS pg_trgm")
        db = _as(admin_url, role)
        try:
            assert await migrate(db, "0055") == "0055"
        finally:
            await db.dispose()
        yield admin_url


def _as(admin_url: str, role: str) -> Database:
    return Database(make_url(admin_url).set(username=role).render_as_string(hide_password=False))


@pytest.mark.postgres
async def test_a_role_that_may_not_create_extensions_migrates(admin_url_at_0055: str, role: str) -> None:
    db = _as(admin_url_at_0055, role)
    try:
        await _inventory(db)
        assert await migrate(db) == head_revision()
        assert await schema_diff(db) == []
        for index in INDEXES:
            assert await index_valid(db, index) is True
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_without_the_extension_the_statement_to_run_is_named(admin_url_at_0055: str, role: str) -> None:
    """pg_trgm dropped since 0027 (CASCADE: with 0027's index): the role may not create it again, so 0056
    fails before building anything, naming the statement; once a superuser has run it, 0056 finishes."""
    sql(admin_url_at_0055, "DROP EXTENSION pg_trgm CASCADE")
    db = _as(admin_url_at_0055, role)
    try:
        with pytest.raises(FailedPrecondition) as refused:
            await migrate(db)
        assert await current_revision(db) == "0055"
        for index in INDEXES:
            assert await index_valid(db, index) is None
        statement = re.search(r"run `([^`]+)`", str(refused.value))
        assert statement is not None, refused.value
        assert statement.group(1) == "CREATE EXTENSION IF NOT EXISTS pg_trgm;"
        assert "migration 0056" in str(refused.value)
        sql(admin_url_at_0055, statement.group(1))
        assert await migrate(db) == head_revision()
        for index in INDEXES:
            assert await index_valid(db, index) is True
    finally:
        await db.dispose()
