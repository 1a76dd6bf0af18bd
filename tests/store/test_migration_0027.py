"""Migration 0027 on PostgreSQL when the migrating role may not create the extension `pg_trgm`: the upgrade
fails naming the one statement a superuser must run, the database stays at 0026 (0027's transaction is
rolled back before its index is built), and once the extension exists, or the role may create it
(PostgreSQL 13 marks it trusted: CREATE on the database is enough), migrating again finishes the schema
`tables.py` declares.

Each test makes a role that is not a superuser and a database it may create tables in but, at first, not
extensions; both are dropped at the end."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.engine import make_url

from rackflow.errors import FailedPrecondition
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from tests.conftest import postgres_admin_url
from tests.e2e.cluster import fresh_postgres_database, sql
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.postgres


@dataclass(frozen=True)
class RoleDatabase:
    """A database at revision 0026, migrated by `role`, who may not create extensions in it yet."""

    admin_url: str  # the same database, as the superuser of the test server
    role: str
    db: Database


@pytest.fixture
def role() -> Iterator[str]:
    name = f"rackflow_migrator_{uuid.uuid4().hex[:10]}"
    sql(postgres_admin_url(), f'CREATE ROLE "{name}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE')
    yield name
    sql(postgres_admin_url(), f'DROP ROLE IF EXISTS "{name}"')


@pytest.fixture
async def at_0026(postgres_url: str, role: str) -> AsyncIterator[RoleDatabase]:
    """`postgres_url` only to fail under CI, or skip elsewhere, when the server is unreachable."""
    with fresh_postgres_database(postgres_admin_url()) as admin_url:
        # The database is the superuser's; the role may create tables in its schema (PostgreSQL 15 no
        # longer lets everyone), not extensions (that needs CREATE on the database, or a superuser).
        sql(admin_url, f'GRANT USAGE, CREATE ON SCHEMA public TO "{role}"')
        db = Database(make_url(admin_url).set(username=role).render_as_string(hide_password=False))
        try:
            assert await migrate(db, "0026") == "0026"
            yield RoleDatabase(admin_url, role, db)
        finally:
            await db.dispose()


async def _refused(db: Database) -> str:
    """The message of the upgrade's failure; the database left at 0026."""
    with pytest.raises(FailedPrecondition) as refused:
        await migrate(db)
    assert await current_revision(db) == "0026"
    assert _extension(db) == []
    return str(refused.value)


def _extension(db: Database) -> list[tuple[object, ...]]:
    return sql(db.url, "SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'")


async def _finishes(db: Database) -> None:
    assert await migrate(db) == head_revision()
    assert _extension(db) == [("pg_trgm",)]
    assert await schema_diff(db) == []


async def test_a_superuser_runs_the_statement_named_then_the_role_migrates(at_0026: RoleDatabase) -> None:
    message = await _refused(at_0026.db)
    statement = re.search(r"run `([^`]+)`", message)
    assert statement is not None, message
    assert statement.group(1) == "CREATE EXTENSION IF NOT EXISTS pg_trgm;"
    assert make_url(at_0026.admin_url).database in message
    sql(at_0026.admin_url, statement.group(1))
    await _finishes(at_0026.db)


async def test_a_role_with_create_on_the_database_creates_the_extension(at_0026: RoleDatabase) -> None:
    (version,) = sql(at_0026.admin_url, "SELECT current_setting('server_version_num')::int")[0]
    if not isinstance(version, int) or version < 130_000:
        pytest.skip("pg_trgm is trusted from PostgreSQL 13")
    await _refused(at_0026.db)
    database = make_url(at_0026.admin_url).database
    sql(at_0026.admin_url, f'GRANT CREATE ON DATABASE "{database}" TO "{at_0026.role}"')
    await _finishes(at_0026.db)
