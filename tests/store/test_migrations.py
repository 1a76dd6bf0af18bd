"""The migrations create exactly the tables of rackflow.store.tables, on both databases."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import insert, select, text

from rackflow.errors import FailedPrecondition
from rackflow.store import dialect
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, require_migrated, scripts
from rackflow.store.tables import instances
from tests.store.schema_diff import schema_diff


async def test_migrated_schema_matches_tables(db: Database) -> None:
    assert await current_revision(db) == head_revision()
    await require_migrated(db)

    assert await schema_diff(db) == []


async def test_a_process_reads_the_migration_scripts_once(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading every revision's file takes about 20 ms of CPU, which each `migrate` paid three times (its
    check, Alembic's upgrade, its answer) and `require_migrated` twice: they now read `scripts()`, once a
    process, and a migration from empty to head and a server's check read no file again."""
    scripts()

    def read_again(*_: object, **__: object) -> ScriptDirectory:
        raise AssertionError("the migration scripts were read again")

    monkeypatch.setattr(ScriptDirectory, "from_config", read_again)
    db = Database(empty_db_url)
    try:
        assert await migrate(db) == head_revision()
        await require_migrated(db)
        assert await migrate(db) == head_revision()  # nothing left to do
    finally:
        await db.dispose()


async def _set_revision(db: Database, revision: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})


@pytest.mark.parametrize("found", ["0099", "zzz"])
async def test_a_database_a_newer_release_migrated_is_refused_saying_so(db: Database, found: str) -> None:
    """The previous release started on a database the new one migrated (a rollback of the binaries):
    `serve` told the operator to run `rackflow db migrate`, and `db migrate` ended in an Alembic traceback
    (`Can't locate revision identified by '0099'`). Both now say what happened and what to do."""
    await _set_revision(db, found)
    try:
        for action in (require_migrated(db), migrate(db)):
            with pytest.raises(FailedPrecondition) as refused:
                await action
            assert str(refused.value) == (
                f"the database is at revision {found}, which this rackflow"
                f" (whose newest is {head_revision()}) does not know: a newer release migrated it. Run that"
                " release or a newer one; to go back to this one, restore the backup taken before the upgrade"
                " (there is no downgrade)"
            )
        assert await current_revision(db) == found  # nothing was changed
    finally:
        await _set_revision(db, head_revision())


async def test_utc_times_round_trip_exactly(db: Database) -> None:
    """SQLite drops offsets; the UTCDateTime type must hand back the same instant, aware, in UTC."""
    stamp = datetime(2026, 3, 8, 2, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5)))
    async with db.transaction() as conn:
        await conn.execute(
            insert(instances).values(id=uuid.uuid4(), host="h", pid=1, started_at=stamp, heartbeat_at=stamp)
        )
    async with db.read() as conn:
        got = (await conn.execute(select(instances.c.started_at))).scalar_one()
    assert got == stamp
    assert got.tzinfo == UTC
    assert got.microsecond == 123456


@pytest.mark.postgres
async def test_a_migration_waiting_its_turn_holds_up_no_index_build_of_the_one_migrating(
    pg_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`rackflow db migrate` run from three hosts at once on a new database: the two waiting for the first's
    advisory lock waited inside a statement, whose snapshot the first's `CREATE INDEX CONCURRENTLY` must
    outwait: a deadlock, which PostgreSQL broke by failing one of them (`deadlock detected … advisory
    lock`, logged as a migration waiting for a table lock, tried again), or the build itself. The one
    migrating here (the test's own connection) builds an index concurrently while a migration waits."""
    holder = await psycopg.AsyncConnection.connect(pg_db, autocommit=True)
    db = Database(pg_db)
    try:
        await holder.execute("SELECT pg_advisory_lock(%s)", (dialect._PG_MIGRATION_LOCK,))
        await holder.execute("CREATE TABLE turn_taking (x int)")
        waiting = asyncio.create_task(migrate(db))

        async def migrate_waits() -> bool:
            found = await holder.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND query LIKE '%advisory_lock%'"
            )
            row = await found.fetchone()
            return row is not None and row[0] > 0

        for _ in range(400):  # until the migration is at the lock (10 s at most)
            if waiting.done() or await migrate_waits():
                break
            await asyncio.sleep(0.025)
        assert not waiting.done()
        await asyncio.wait_for(
            holder.execute("CREATE INDEX CONCURRENTLY turn_taking_x ON turn_taking (x)"), 30
        )
        await holder.execute("SELECT pg_advisory_unlock(%s)", (dialect._PG_MIGRATION_LOCK,))
        assert await asyncio.wait_for(waiting, 30) == head_revision()
        assert not [r for r in caplog.records if "waiting for a table lock failed" in r.getMessage()]
    finally:
        await holder.close()
        await db.dispose()
